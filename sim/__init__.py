"""Virtual-time driver: a deterministic discrete-event loop that runs the same pure core as the live
services (engine cores, directory and counts, routing, planner) on simulated clusters.
"""
