"""The Mosaic row kernel (64 W2 rows on the WGMMA's M, up to 4 batch rows on N): its
launch description (``spec``), the chunk products and candidates (``products``), its body
(``kernel``) and its launch (``launch``); the plan is ``mosaic_plan``'s."""
