"""Ray wiring of the Cooper step: the trainer, the trainable reward-model actor, the pair-construction actor.

Actors here are thin transports: the step's logic they call lives in the core (`core/`: rewards, pairs, metrics,
the hacking response, and `core/pair_builder.py`, which imports no Ray) so that it is unit-tested without a cluster.
"""
