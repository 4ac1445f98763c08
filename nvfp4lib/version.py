"""The package's version, in a module of its own so that the modules that report it (device) need not
import the package's ``__init__``, whose lazy names lead back to them."""

__version__ = "0.1.0"
