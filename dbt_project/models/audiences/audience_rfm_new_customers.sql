{{ rfm_audience("New Customers") }}
