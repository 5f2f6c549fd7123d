"""The test kit shipped with the library, for checking your own stores and pipelines.

`conformance` runs the capture-store contract against any sink/source pair, `contracts`
holds the contract suites (one test per behaviour) to subclass per store, `synthetic`
builds realistic agent captures, and `faults` names the crash points crash tests use.
Nothing here is imported by the library's normal paths except `faults.crash_point`.
"""
