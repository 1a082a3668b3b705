"""Archive analytics and cross-member audit on Apache Spark (``cluster-pipeline``).

* :mod:`.source`: finds members' archives and reads them through a PySpark Python data
  source, one partition per segment file, decoded with the project's record scanner and
  log codec into Arrow record batches.
* :mod:`.job`: the Spark job (tables ``log_entries``, ``sessions``, ``terms``,
  ``timers`` as Parquet).
* :mod:`.report`: ``report.json``, the consistency check, the summary and the plot.
* :mod:`.java`: makes sure a Java runtime is there.

Needs the ``spark`` extra (``pip install -e '.[spark]'``); importing this package alone
does not import Spark.
"""
