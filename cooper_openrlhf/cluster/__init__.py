"""Cluster launch support: the GPU placement rule, pre-submit checks of every launcher, prompt preparation."""
