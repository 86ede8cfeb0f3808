"""Long Range Arena (Tay et al. 2021) configs with LRA's own recipe: Text, ListOps, Retrieval
(``configs/``; the ListOps data is the core's embedded ``listops``)."""
