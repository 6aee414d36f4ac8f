"""``show``: journals → a model (``model``, ``verdict``, ``cause``) → views (``main``, ``gantt``, ``svg``, ``page``)."""
