"""zerocomm.integrations: adapters that let a training framework run on zerocomm.

Each module imports its framework and is imported only by a user who uses that framework; this package
imports none of them.
"""
