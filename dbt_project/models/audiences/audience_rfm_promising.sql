{{ rfm_audience("Promising") }}
