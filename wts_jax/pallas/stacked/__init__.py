"""The stacked int8-planes Mosaic GPU kernel (the planes stacked on the WGMMA's M, z in
registers): its plan and launch (``plan``, ``spec``, ``launch``), its body (``kernel``,
``phase``) and its register-level pieces (``threads``, ``operands``, ``fold``,
``bests``)."""
