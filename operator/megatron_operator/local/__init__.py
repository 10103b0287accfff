"""`mjob run --local`: run rendered pods as local process groups."""
