{{ rfm_audience("At Risk") }}
