"""Long Range Arena (Tay et al. 2021): the ListOps dataset (``listops.py``) and configs with LRA's
own recipe: Text, ListOps, Retrieval (``configs/``).

Importing this package registers the embedded datasets ``listops`` and ``listops/small``: set
``train.projects=lra`` to use them (e.g. ``--config.train.projects=lra``).
"""

from projects.lra import listops  # pylint: disable=unused-import  (registers the datasets)
