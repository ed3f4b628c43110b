{{ rfm_audience("Lost") }}
