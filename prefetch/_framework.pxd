# The compiled part of the seam prefetch/_framework.py declares: what a
# drop-in's Cython module may cimport of the core (its copy plan and blocks).
from prefetch._core cimport CopyPlan, pf_block, put_block, take_block
