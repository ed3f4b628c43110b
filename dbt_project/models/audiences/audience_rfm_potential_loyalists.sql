{{ rfm_audience("Potential Loyalist") }}
