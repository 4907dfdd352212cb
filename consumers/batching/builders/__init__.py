"""Pure batch builders: scored trajectories in, training rows out. No I/O, no clocks (time is passed in).

Which builder makes which batch kind is `consumers/batching/kinds.py`.
"""
