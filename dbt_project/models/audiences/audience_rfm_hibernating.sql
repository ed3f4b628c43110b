{{ rfm_audience("Hibernating") }}
