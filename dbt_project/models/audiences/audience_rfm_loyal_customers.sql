{{ rfm_audience("Loyal Customers") }}
