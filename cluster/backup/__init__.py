"""Backups of a live cluster (issue 34), pulled over the members' admin ports.

- :mod:`.serve`: the member's side, the admin commands ``backup-query`` and
  ``backup-read`` (refused like control commands: loopback or an admin principal);
- :mod:`.link`: a backup's connection to a member, every chunk checked;
- :mod:`.store`: the backup directory (the format ``cluster-tool restore`` reads),
  written atomically;
- :mod:`.pull`: one pass from one member (snapshot, log, retention, manifest);
- :mod:`.oneshot`: ``cluster-tool backup --out DIR``;
- :mod:`.follow`, :mod:`.http`, :mod:`.main`: ``cluster-backup``, the continuous
  backup (Aeron's ClusterBackup): it polls a follower, never votes, reports its lag.
"""
