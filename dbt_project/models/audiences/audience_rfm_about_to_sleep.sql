{{ rfm_audience("About To Sleep") }}
