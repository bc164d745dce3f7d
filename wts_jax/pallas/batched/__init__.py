"""The batched Mosaic GPU kernel (the batch on the WGMMA's M or N): its plan and planner
(``plan``, ``auto``), its launch (``spec``, ``launch``) and its body in parts (``kernel``
composing ``context``, ``rings``, ``z_staging``, ``head_update`` and its strategies,
``chunks``, ``epilogue``, ``exchange``)."""
