"""How a run's settings are declared: the list syntax of list-valued fields (``settings.lists``)."""
