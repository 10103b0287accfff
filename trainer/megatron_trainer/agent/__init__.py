"""The launcher's side of the restart ladder (docs/architecture.md, "The restart ladder").

- `wire`: the messages between launchers and the coordinator (JSON lines over TCP);
- `ranks`: the pod's rank processes (start, signal, reap, kill every descendant);
- `agent`: the in-place supervision loop every launcher runs;
- `coordinator`: the server in the launcher of node rank 0 (connections, the barrier, the
  report), fed by a `sources` decision source (the job watch, or a status file locally) and
  writing through a report sink (the progress Lease, or a file locally);
- `kubeapi`: the few apiserver calls, with the pod's own service account.

Standard library only: a launcher starts in milliseconds and never imports torch.
"""
