"""The workflow's stages: one module per Snakemake rule, one public function each.

A stage reads its inputs (paths), calls the engine's public API and writes its outputs
atomically; it is importable and testable without Snakemake. The engine modules never see
a config key. Modules are imported one by one (`from oattn_lib.stages.organize import
organize`): this package imports none of them, so a stage pays only for what it uses and
its code fingerprint (`oattn_lib.fingerprint`) covers only the code it runs.
"""
