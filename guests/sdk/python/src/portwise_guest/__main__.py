"""`python -m portwise_guest` prints the WIT directory (componentize-py -d)."""

from portwise_guest import wit_dir

print(wit_dir())
