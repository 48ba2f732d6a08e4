"""A method added from outside the package, by one folder and one registration: coordinate-wise median
aggregation (FedMedian, Yin et al., ICML 2018). Its part names only its aggregator; the rounds, the sites'
training and evaluation, the report and the site policy are the project's shared machinery."""
