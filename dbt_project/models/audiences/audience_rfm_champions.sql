{{ rfm_audience("Champions") }}
