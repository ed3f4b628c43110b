{{ rfm_audience("Need Attention") }}
