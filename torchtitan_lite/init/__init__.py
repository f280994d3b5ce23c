"""The init engine: init plans as data (``spec.py``), keyed sampling (``sampling.py``), applying a plan
(``apply.py``), the init report (``report.py``), the fingerprint (``fingerprint.py``) and the expected
step-1 loss (``step1.py``)."""
