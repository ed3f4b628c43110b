{{ rfm_audience("Can't Lose Them") }}
