"""The cell builder: one wheel from one spec. Standard library only.

It is the one thing mounted into builder containers and run on GPU runners:
``python -m attnforge.builder --spec SPEC.json`` on a host, ``python -m builder --spec SPEC.json`` with
this folder mounted at ``/opt/attnforge/builder`` in a container. Modules, in the order a build uses them:
``spec`` (the spec type), ``source`` (fetch, verify, unpack), ``patches`` (the patch engine), ``torchenv``
(the interpreter and its torch), ``compiler`` (the host-compiler probe), ``knobs`` (the kernel's build
environment), ``procs`` + ``ninja`` (running pip and following ninja), ``objects`` (kernel objects
shared between cells), ``importcheck``, ``main`` (the steps in order, ``result.json``). Exit codes and
progress events: ``exits``.
"""
