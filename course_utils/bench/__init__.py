"""Benchmarks: ``python -m course_utils.bench <suite> [options]``.

Each suite is a module here with a ``main(argv)``: ``attention`` (lessons 6-7),
``hopper`` (lesson 8), ``decode`` (lesson 9). Results land in
``benchmarks/<device>/<suite>.json`` with the device, the versions and the command
that produced them; every figure is reported next to a baseline measured in the
same run.
"""
