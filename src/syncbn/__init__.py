"""Synchronized BatchNorm: modules, autograd function, collectives and the kernel extension loader."""
