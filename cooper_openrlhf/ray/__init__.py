"""Ray wiring of the Cooper step: the trainer, the trainable reward-model actor, the pair-construction actor.

Actors here are thin: the logic they call lives in pure modules (`algo/`, `verify/`, and
`ray/pair_builder.py`, which imports no Ray) so that it is unit-tested without a cluster.
"""
