"""Gradient alignment of the sites' weight differences on the server (Algorithm 1); the math is in
:mod:`feddg.methods.gradalign`."""
