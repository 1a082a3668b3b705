"""Archive analytics and cross-member audit on Apache Spark (``cluster-pipeline``).

* :mod:`.fs`: locations (paths or Hadoop URIs: ``file://``, ``hdfs://``, ``s3a://``)
  through the Spark session's Hadoop file system.
* :mod:`.source`: finds members' archives and reads their segment files with Spark's
  ``binaryFile`` data source, one partition per segment file, decoded on the executors
  (``mapInArrow``) with the project's record checks and log codec into Arrow batches.
* :mod:`.job`: the Spark job (tables ``log_entries``, ``sessions``, ``terms``,
  ``timers``, ``admin_actions`` as Parquet partitioned by ``date``).
* :mod:`.report`: ``report.json``, the consistency check, the summary and the plot.
* :mod:`.java`: makes sure a Java runtime is there.

Needs the ``spark`` extra (``pip install 'triarch[spark]'``); importing this package alone
does not import Spark.  See ``docs/pipeline.md``.
"""
