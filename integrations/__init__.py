"""zerocomm.integrations: adapters for training frameworks; each module is imported only by the user who wants it."""
