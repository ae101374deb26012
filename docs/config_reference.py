"""The configuration reference page: every key of the config schema, and what changing it reruns.

The site's hook (docs/hooks.py) builds the page reference/config.md at every build from two
sources:

- the schema, oattn_lib/schemas/config.schema.yaml (the workflow's
  workflow/schemas/config.schema.yaml links to it): each key with its type, default, allowed
  values and description, walked by `schema_keys` (cheap);
- docs/reference/reruns.yaml: which stages rerun when each key changes, measured on the
  workflow itself by `measure_reruns` (a minute or two, so its output is committed):

      .venv/bin/python docs/config_reference.py      # rewrites docs/reference/reruns.yaml

How the reruns are measured. The rules read the config only through `params:`, so Snakemake
reruns a job when its params, its set of input files or its code changed since its outputs
were written, a job it has never run (a new output), and every job downstream of one that
reruns (newer inputs). `measure_reruns` plans the workflow in this process with Snakemake's
API (every job, as `--forceall` would list them) on a base config, records each job's params
and inputs exactly as Snakemake's persistence records them, then, for each leaf key, plans
again with that key changed and compares: a job reruns when one of its outputs has no job in
the base plan, or its params or inputs differ from those of the base job writing it (params
less `code`, the fingerprint of the library code a rule runs, which no key changes). The page
lists the stages of those jobs (a batch rule `<stage>_batch_<model>` counts for its stage) and
the stages downstream of them. Nothing is typed by hand: a rule that starts reading a key
changes the measurement, and tests/test_site.py fails until this file is regenerated.

The base config is the test config (workflow/presets/test.yaml, the config tests/ run) with
a fourth model of kind `attention` reading two small .npy files, so that every kind is
planned. A key is changed to each value `changes` gives (integers: their minimum and one more;
enums: up to two other values; booleans: the other one; ...), and the reruns are the union over
those values the config validation accepts. A few keys only matter with another key set
(`CONTEXT`: the softmax-free experiment's keys with it enabled, for example), and a few cannot
be changed on this config (`NOT_MEASURED`: the reason is on the page).
"""
from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

# libyaml's parser where PyYAML has it (the pure-Python one is several times slower)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "oattn_lib" / "schemas" / "config.schema.yaml"
RERUNS = Path(__file__).resolve().parent / "reference" / "reruns.yaml"
KINDS = ("txl", "vit", "hf", "attention")


# -- the schema's keys ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """One key of the config: `path` its names from the top (`models[]` for an entry of the
    list of models), `kind` the model kind whose branch of the schema defines it (None where
    every kind has it), `node` its schema (references resolved), `group` True for a section
    (an object whose keys are listed after it)."""

    path: tuple[str, ...]
    kind: str | None
    node: dict
    group: bool = False

    @property
    def name(self) -> str:
        return ".".join(self.path).replace(".[]", "[]")

    @property
    def anchor(self) -> str:
        """The key's anchor on the page: its dotted path, a kind's branch after `models`
        (`models.txl.data.corpus`)."""
        parts = [p for p in self.path if p != "[]"]
        if self.kind:
            parts.insert(1, self.kind)
        return ".".join(parts)


def load_schema(path: Path = SCHEMA) -> dict:
    return yaml.load(path.read_text(), Loader=_LOADER)  # noqa: S506 (a safe loader)


def _resolve(node: dict, schema: dict) -> dict:
    while "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"{ref}: only references within the schema are followed")
        target = schema
        for part in ref[2:].split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _kind_branches(node: dict) -> dict[str, dict]:
    """{kind: the properties its `if kind == ... then` branch sets} of the model schema."""
    out = {}
    for branch in node.get("allOf", []):
        const = branch.get("if", {}).get("properties", {}).get("kind", {}).get("const")
        if const:
            out[const] = branch.get("then", {}).get("properties", {})
    return out


def schema_keys(schema: dict) -> list[Key]:
    """Every key of the schema, in its order: sections (objects with keys of their own) and
    leaves. A model's `data`, `arch` and `train` differ by kind: their keys come once per kind
    whose branch defines them, with that kind."""
    out: list[Key] = []

    def walk(node: dict, path: tuple[str, ...], kind: str | None) -> None:
        node = _resolve(node, schema)
        if node.get("type") == "array" and isinstance(node.get("items"), dict) and "$ref" in node["items"]:
            out.append(Key(path, kind, node, group=True))
            walk(node["items"], (*path, "[]"), kind)
            return
        props = node.get("properties")
        if props is None or not path:
            if path:
                out.append(Key(path, kind, node))
            if props is None:
                return
        else:
            out.append(Key(path, kind, node, group=True))
        branches = _kind_branches(node)
        for name, sub in props.items():
            by_kind = {k: b[name] for k, b in branches.items() if name in b and "$ref" in b[name]}
            if by_kind and not _resolve(sub, schema).get("properties"):
                for k, branch in by_kind.items():
                    walk({**_resolve(branch, schema), "description": _resolve(branch, schema).get("description")},
                         (*path, name), k)
                continue
            walk(sub, (*path, name), kind)

    walk(schema, (), None)
    return out


def leaf_keys(schema: dict) -> list[Key]:
    return [k for k in schema_keys(schema) if not k.group]


def empty_for(schema: dict) -> dict[str, list[str]]:
    """{model key: kinds for which it must be empty ({}}): a kind's branch with maxProperties 0."""
    model = _resolve(schema["properties"]["models"]["items"], schema)
    out: dict[str, list[str]] = {}
    for kind, props in _kind_branches(model).items():
        for name, sub in props.items():
            if sub.get("maxProperties") == 0:
                out.setdefault(name, []).append(kind)
    return out


def required_for(schema: dict) -> dict[str, list[str]]:
    """{model key: kinds that require it}, from the model's `required` and its kind branches."""
    model = _resolve(schema["properties"]["models"]["items"], schema)
    out = {name: ["every kind"] for name in model.get("required", [])}
    for branch in model.get("allOf", []):
        kind = branch.get("if", {}).get("properties", {}).get("kind", {}).get("const")
        for name in branch.get("then", {}).get("required", []):
            out.setdefault(name, []).append(kind)
    return out


# -- a key's type, default and allowed values, in words -----------------------------------------
def _flow(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _bounds(node: dict) -> list[str]:
    out = []
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in node:
            out.append(f"{sign} {node[key]}")
    return out


def _items(n: int) -> str:
    return f"{n} item" + ("" if n == 1 else "s")


def type_text(node: dict) -> str:
    """The type and allowed values of a schema node, in words ("integer ≥ 1 or `all`")."""
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if "enum" in node:
        return "one of " + ", ".join(f"`{_flow(v)}`" for v in node["enum"])
    parts = []
    for t in types:
        if t in ("integer", "number"):
            parts.append(" ".join([t, ", ".join(_bounds(node))]).strip())
        elif t == "string":
            if node.get("pattern") == "^all$":
                parts.append("`all`")
            elif "then" in node and "enum" in node["then"]:
                parts.append("one of " + ", ".join(f"`{v}`" for v in node["then"]["enum"]))
            else:
                parts.append("string" + (" (non-empty)" if node.get("minLength") else "")
                             + (f", at most {node['maxLength']} characters" if "maxLength" in node else "")
                             + (f", matching `{node['pattern']}`" if "pattern" in node else ""))
        elif t == "array":
            items = node.get("items", {})
            n = (node.get("minItems"), node.get("maxItems"))
            size = f"{n[0]} items" if n[0] is not None and n[0] == n[1] else ", ".join(
                x for x in (f"at least {_items(n[0])}" if n[0] else "", f"at most {_items(n[1])}" if n[1] else "") if x)
            what = "list" + (f" ({size}" + (", distinct" if node.get("uniqueItems") else "") + ")" if size
                             else " (distinct items)" if node.get("uniqueItems") else "")
            inner = type_text(items) if items else ""
            parts.append(f"{what} of {inner}" if inner else what)
        elif t == "object":
            parts.append("mapping" + (" of names to strings or integers" if "additionalProperties" in node
                                      and isinstance(node["additionalProperties"], dict) else ""))
        elif t == "null":
            parts.append("`null`")
        else:
            parts.append(t)
    return " or ".join(parts) if parts else "any"


def default_text(key: Key, required: dict[str, list[str]]) -> str:
    """"default `x`", "required (for kind ...)" or "optional, no default"."""
    if "default" in key.node:
        return f"default `{_flow(key.node['default'])}`"
    if key.path[:2] == ("models", "[]") and len(key.path) == 3 and key.path[2] in required:
        kinds = required[key.path[2]]
        return "required" + ("" if kinds == ["every kind"] else " for kind " + ", ".join(f"`{k}`" for k in kinds))
    return "optional, no default"


def _description(node: dict) -> str:
    """A key's description as markdown prose: a sentence's capital (not for one that starts by
    naming the kind it is for, "hf: ..."), and outside code spans the characters markdown would
    read as HTML, emphasis or a link escaped."""
    text = " ".join(str(node.get("description") or "").split())
    if text and not re.match(r"(\w+:|(hf|txl|vit)\b)", text):
        text = text[0].upper() + text[1:]
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else re.sub(r"([*\[\]])", r"\\\1", p).replace("<", "&lt;")
                   for p in parts)


# -- the page --------------------------------------------------------------------------------
def _stages(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def reruns_text(entry: dict | None) -> str:
    """What a key's entry of reruns.yaml says, in words."""
    if entry is None:
        return "not measured yet (regenerate docs/reference/reruns.yaml: `python docs/config_reference.py`)"
    if "not_measured" in entry:
        return "not measured: " + entry["not_measured"]
    if not entry["reruns"]:
        return "nothing (no rule's params or inputs change)"
    text = _stages(entry["reruns"])
    if entry.get("then"):
        text += ", then what follows: " + _stages(entry["then"])
    if entry.get("context"):
        text += f" (measured with {entry['context']})"
    return text


INTRO = """\
# Configuration reference

Every key of the workflow's configuration, generated from its schema
(`oattn_lib/schemas/config.schema.yaml`, which `workflow/schemas/config.schema.yaml` links to)
at each build of this site. The schema holds every default: a key you leave out of your
config takes the value shown here. Snakemake validates the config against it at start-up, so a
misspelt key or a value out of range stops the run at once, naming the key.

**Reruns** says which stages (Snakemake rules; a batch rule `<stage>_batch_<model>` counts for
its stage) run again when you change the key in a config whose results exist, and after them
the stages that follow because their inputs are rewritten. The rules read the config only
through their `params:`, so Snakemake reruns exactly the jobs whose params (or set of inputs)
change. This was measured, not written by hand: `docs/config_reference.py` plans the workflow
with Snakemake's API on the test config (`workflow/presets/test.yaml`, plus a model of kind
`attention`), changes one key at a time and compares every job's params and inputs with
Snakemake's own records of them. Where a key matters only for some models (a kind, scores
rather than probabilities), the stages are those of such a model. A key that changes no job
(cluster resources, `check_disk`) reruns nothing.

"""


def render(schema: dict, reruns: dict) -> str:
    """The markdown of the configuration reference: `schema` the config schema, `reruns`
    docs/reference/reruns.yaml ({anchor: entry})."""
    required = required_for(schema)
    empty = empty_for(schema)
    lines = [INTRO]
    keys = [k for k in schema_keys(schema) if k.path]
    # the top-level keys that are no section first, then each section with its keys
    top = [k for k in keys if len(k.path) == 1 and not k.group]
    if top:
        lines.append("## Top-level keys\n")
    for key in top + [k for k in keys if len(k.path) > 1 or k.group]:
        if not key.group:
            lines.append(_key_block(key, required, reruns.get(key.anchor)))
        elif key.path == ("models",):
            lines.append("## `models`\n")
            lines.append("The networks analysed: a list of entries, each with the keys below. "
                         + _kind_text(empty) + "\n")
        elif key.path != ("models", "[]"):
            title = f"`{key.name}`" + (f" (kind `{key.kind}`)" if key.kind else "")
            level = "##" if len(key.path) == 1 else "###"
            lines.append(f"{level} {title} {{#{key.anchor}}}\n")
            if _description(key.node):
                lines.append(_description(key.node) + "\n")
            elif key.kind:
                lines.append(f"For a model of kind `{key.kind}`.\n")
    return "\n".join(lines).rstrip() + "\n"


def _kind_text(empty: dict[str, list[str]]) -> str:
    parts = [f"`{name}` must be empty for kind " + ", ".join(f"`{k}`" for k in kinds)
             for name, kinds in sorted(empty.items())]
    return ("A model's `data`, `arch` and `train` keys depend on its `kind`; " + "; ".join(parts) + ".") if parts \
        else ""


def _key_block(key: Key, required: dict[str, list[str]], entry: dict | None) -> str:
    out = [f"#### `{key.path[-1]}` {{#{key.anchor}}}\n",
           f"`{key.name}`" + (f" (kind `{key.kind}`)" if key.kind else "") + f" · {type_text(key.node)} · "
           f"{default_text(key, required)}\n"]
    if _description(key.node):
        out.append(_description(key.node) + "\n")
    out.append(f"**Reruns:** {reruns_text(entry)}\n")
    return "\n".join(out)


# -- measuring the reruns ---------------------------------------------------------------------
TEST_CONFIG = ROOT / "workflow" / "presets" / "test.yaml"

# keys measured with other keys set (on the base config and on its changes): {key anchor, or a
# section's prefix ending in ".": (settings, the same in words)}; "models" maps a model's name
# to its settings; TEXTS and JSONL name the files base_config writes
TEXTS = "texts.txt"
JSONL = "texts.jsonl"
CONTEXT = {
    # the experiment runs under its own target unless enabled; a smaller one than the default
    "softmax_free.": ({"softmax_free": {"enabled": True, "seeds": 1, "variants": ["tensor_q", "tensor_k"]}},
                      "`softmax_free.enabled: true`"),
    "softmax_free.enabled": ({}, ""),
    # a corpus that is downloaded, so that its folder matters
    "data_root": ({"models": {"txl": {"data": {"corpus": "wikitext103"}}}}, "a txl model's corpus `wikitext103`"),
    # the user's own texts
    "models.hf.data.field": ({"models": {"lm": {"data": {"texts": JSONL}}}}, "`data.texts` a .jsonl file"),
    "models.hf.data.chat": ({"models": {"lm": {"path": "smollm2", "data": {"texts": TEXTS}}}},
                            "SmolLM2 (a chat template) and `data.texts` a text file"),
    "prune.held_out.field": ({"prune": {"held_out": {"texts": JSONL}}}, "`prune.held_out.texts` a .jsonl file"),
    # the value it is changed to (SPECIAL), in words
    "models.prune": ({}, "`prune: {random_seeds: 2}` set on each model"),
}
# keys that cannot be changed on the base config: {anchor: why}
NOT_MEASURED = {
    "models.kind": "another kind is another model: every stage of that model runs",
    "models.extract.stack": "needs an encoder-decoder model (none is offline); every stage of that model runs "
                            "again, as for any change of what is extracted",
    "models.hf.data.target_field": "needs an encoder-decoder model (extract.stack)",
    "models.gguf_file": "needs a second GGUF file of the same model",
    "models.vit.arch.variant": "vit_b_16 needs torchvision's ImageNet weights (downloaded)",
    "models.pretrained": "needs torchvision's ImageNet weights of vit_b_16 (downloaded)",
}
# values a key is changed to where the rule of `changes` cannot find one: {anchor: values, or
# {kind: values} for a model key ("*": every kind)}
SPECIAL = {
    "models.path": {"hf": ["smollm2"]},
    "models.device_map": {"hf": ["auto"]},
    "models.extract.crop": {"vit": [[1, 17]]},
    "models.quantity_in_file": {"attention": ["scores"]},
    "models.hf.data.texts": {"hf": [TEXTS]},
    "models.hf.data.field": {"hf": ["body"]},
    "models.prune": {"*": [{"random_seeds": 2}]},
    "prune.held_out.texts": [TEXTS],
    "softmax_free.models": [["txl"]],
    "prune.held_out.field": ["body"],
    "compare": [[{"a": "txl", "b": "vit", "heads": True}]],
}


def base_config(workdir: Path) -> dict:
    """The test config, with a model of kind `attention` (two .npy files of probabilities,
    (layer, head, query, key) = (1, 2, 6, 6)) and two text files, written into `workdir`."""
    import numpy as np

    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg["results"] = "results"
    cfg["check_disk"] = False
    files = workdir / "attention"
    files.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(2):
        x = rng.random((1, 2, 6, 6)).astype(np.float32)
        np.save(files / f"sample{i}.npy", x / x.sum(-1, keepdims=True))
    cfg["models"].append({"name": "att", "kind": "attention", "path": str(files), "extract": {"n_samples": 2}})
    texts = [f"Text number {i} of the reference's own texts, long enough to be tokenized." for i in range(12)]
    (workdir / TEXTS).write_text("\n".join(texts) + "\n")
    (workdir / JSONL).write_text("".join(json.dumps({"text": t, "body": t.upper()}) + "\n" for t in texts))
    return cfg


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def changes(value, node: dict) -> list:
    """The values a key holding `value` (schema `node`) is changed to: the other values of an
    enum (the first and the last where there are more than two) or a boolean; an integer's
    minimum (or maximum) and one more (or less); a number halved (0: 0.5); `all` and an
    integer for the keys that take both; a list shortened or lengthened. [] where no rule
    applies."""
    types = node.get("type", [])
    types = {types} if isinstance(types, str) else set(types)
    if "enum" in node:
        others = [v for v in node["enum"] if v != value]
        return others if len(others) <= 2 else [others[0], others[-1]]
    if isinstance(value, bool):
        return [not value]
    if value == "all":
        return [1]
    if isinstance(value, int) and "integer" in types:
        lo, hi = node.get("minimum"), node.get("maximum")
        out = [lo if lo is not None and lo != value else hi if hi is not None and hi != value else None,
               value + 1 if hi is None or value + 1 <= hi else value - 1]
        if "string" in types:
            out.append("all")
        return [v for v in dict.fromkeys(out) if v is not None and v != value]
    if isinstance(value, float) or (isinstance(value, int) and "number" in types):
        return [value / 2 if value else 0.5]
    if value is None and "array" in types:
        return [[0]]
    if isinstance(value, list):
        if value and isinstance(value[0], list):  # figure_heads
            return [value[:1] if len(value) > 1 else value + [[0, 1]]]
        if len(value) > node.get("minItems", 0) and value:
            return [value[:-1]]
        items = node.get("items", {})
        if "enum" in items:
            return [value + [next(v for v in items["enum"] if v not in value)]]
        if items.get("type") == "integer":
            return [[v - 1 for v in value] if value else [1]]
        return []
    if isinstance(value, str):
        return [value + "2"]
    return []


def fallbacks(value, node: dict) -> list:
    """Values tried where none of `changes` validates (an integer another key must divide or
    be divided by): an integer doubled and halved."""
    if isinstance(value, int) and not isinstance(value, bool):
        lo = node.get("minimum", 0)
        return [v for v in (2 * value, value // 2) if v >= lo and v != value]
    return []


def _get(cfg: dict, path: tuple[str, ...]):
    for p in path:
        cfg = cfg.get(p) if isinstance(cfg, dict) else None
    return cfg


def _set(cfg: dict, path: tuple[str, ...], value) -> None:
    for p in path[:-1]:
        cfg = cfg.setdefault(p, {})
    cfg[path[-1]] = value


class Planner:
    """Plans the workflow in this process (Snakemake's API, every job as --forceall lists them).
    `plan` returns ({a job's outputs: (its stage, params, inputs)}, {a job's outputs: the
    outputs of the jobs it reads}). Snakemake changes the working directory while it plans; it
    is restored."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def plan(self, cfg: dict) -> tuple[dict, dict]:
        import snakemake.api  # noqa: F401  first: importing snakemake.workflow first is circular
        from snakemake.api import SnakemakeApi
        from snakemake.settings.types import (ConfigSettings, DAGSettings, OutputSettings, Quietness,
                                              ResourceSettings)

        from oattn_lib.plan import rule_stage

        # the config is given as --config would give it (parsing it from a file is slower); the
        # Snakefile's own `configfile:` gets a file holding one key of it
        (self.workdir / "config.yaml").write_text(yaml.safe_dump({"results": cfg["results"]}))
        cwd = os.getcwd()
        try:
            with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
                wapi = api.workflow(resource_settings=ResourceSettings(cores=2),
                                    config_settings=ConfigSettings(config=copy.deepcopy(cfg)),
                                    snakefile=ROOT / "Snakefile", workdir=self.workdir)
                dag_settings = DAGSettings(forceall=True)
                wf = wapi._workflow
                wf.dag_settings = dag_settings
                wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
                wf._build_dag()
                persistence = wf.persistence
                jobs, producer = {}, {}
                for job in wf.dag.jobs:
                    if job.rule.name == "all":
                        continue
                    outputs = tuple(sorted(map(str, job.output)))
                    record = (rule_stage(job.rule.name), _config_params(persistence, job),
                              tuple(sorted(persistence._input(job))))
                    jobs[outputs] = record
                    for f in outputs:
                        producer[f] = outputs
                edges = {out: {producer[f] for f in jobs[out][2] if f in producer} for out in jobs}
        finally:
            os.chdir(cwd)
        return jobs, edges


def _config_params(persistence, job) -> tuple:
    """The params Snakemake records for `job` (as it serialises them), less the `code` param:
    the fingerprint of the library the job runs, which a config key never changes (and which an
    edit of the code while this measures would change)."""
    params = list(persistence._params(job))
    if "code" in job.params.keys():
        params.remove(persistence._serialize_param(job.params.code))
    return tuple(params)


def _diff(base: tuple[dict, dict], new: tuple[dict, dict]) -> tuple[set, set]:
    """The stages that rerun in plan `new` against plan `base` and those after them."""
    base_jobs, _ = base
    jobs, edges = new
    by_file = {f: rec for out, rec in base_jobs.items() for f in out}
    direct = {out for out, rec in jobs.items()
              if any(f not in by_file or by_file[f][1:] != rec[1:] for f in out)}
    # downstream: every job one of whose inputs a rerun job writes, and so on
    dependents: dict = {}
    for out, ups in edges.items():
        for up in ups:
            dependents.setdefault(up, set()).add(out)
    seen, todo = set(direct), list(direct)
    while todo:
        for d in dependents.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    stages = {jobs[o][0] for o in direct}
    return stages, {jobs[o][0] for o in seen} - stages


def stage_order(plan: tuple[dict, dict]) -> dict[str, int]:
    """Each stage's depth in the plan (the longest chain of inputs of its jobs), to list stages
    in the order they run."""
    jobs, edges = plan
    depth: dict = {}

    def d(out):
        if out not in depth:
            depth[out] = 0
            depth[out] = 1 + max((d(u) for u in edges[out]), default=-1)
        return depth[out]

    order: dict[str, int] = {}
    for out, rec in jobs.items():
        order[rec[0]] = max(order.get(rec[0], 0), d(out))
    return order


def _model_targets(cfg: dict, key: Key) -> list[int]:
    """The models a model key is changed on: those of its kind, for stability keys those with a
    stability section."""
    out = []
    for i, m in enumerate(cfg["models"]):
        if key.kind and m["kind"] != key.kind:
            continue
        if key.path[2:3] == ("stability",) and "stability" not in m:
            continue
        out.append(i)
    return out


def _context(key: Key) -> tuple[dict, str]:
    if key.anchor in CONTEXT:
        return CONTEXT[key.anchor]
    for prefix, (settings, words) in CONTEXT.items():
        if key.anchor == prefix or (prefix.endswith(".") and key.anchor.startswith(prefix)):
            return settings, words
    return {}, ""


def _apply_context(cfg: dict, settings: dict, workdir: Path) -> dict:
    settings = _files(settings, workdir)
    models = settings.pop("models", {})
    cfg = _merge(cfg, settings)
    for m in cfg["models"]:
        if m["name"] in models:
            m.update(_merge(m, models[m["name"]]))
    return cfg


def _variants(cfg: dict, completed: dict, key: Key, workdir: Path, values=changes) -> list[dict]:
    """The configs with `key` changed: one per value (`values(value, node)`), on every model it
    applies to at once."""
    special = SPECIAL.get(key.anchor)
    if key.path[0] != "models":
        values = special if isinstance(special, list) else values(_get(completed, key.path), key.node)
        out = []
        for v in values:
            c = copy.deepcopy(cfg)
            _set(c, key.path, _files(v, workdir))
            out.append(c)
        return out
    rel = key.path[2:]
    targets = _model_targets(cfg, key)
    per_value: dict = {}
    for i in targets:
        m = completed["models"][i]
        if key.anchor == "models.name":  # another name than every model's
            new = [m["name"] + "2"]
        elif special is not None:
            new = special.get(m["kind"], special.get("*", []))
        else:
            new = values(_get(m, rel), key.node)
        for j, v in enumerate(new):
            per_value.setdefault(j, []).append((i, v))
    out = []
    for pairs in per_value.values():
        # every model at once; where that does not validate (a value one of them refuses), one
        # model at a time
        together = _with_models(cfg, key, pairs, workdir)
        out += [together] if len(pairs) == 1 or _problem(together) is None else \
            [_with_models(cfg, key, [p], workdir) for p in pairs]
    return out


def _with_models(cfg: dict, key: Key, pairs: list, workdir: Path) -> dict:
    c = copy.deepcopy(cfg)
    for i, v in pairs:
        m = c["models"][i]
        if key.anchor == "models.prune":
            m["prune"] = v
        else:
            _set(m, key.path[2:], _files(v, workdir))
    return c


def _files(value, workdir: Path):
    """`value` with the names of the files base_config writes made absolute."""
    if isinstance(value, str) and value in (TEXTS, JSONL):
        return str(workdir / value)
    if isinstance(value, dict):
        return {k: _files(v, workdir) for k, v in value.items()}
    return value


def _completed(cfg: dict) -> dict:
    from oattn_lib.config import validate_config

    c = copy.deepcopy(cfg)
    validate_config(c, str(SCHEMA), check_disk=False)
    return c


def _problem(cfg: dict) -> str | None:
    """What the config validation refuses in `cfg` (None: nothing)."""
    from oattn_lib.config import ConfigError

    try:
        _completed(cfg)
    except ConfigError as exc:
        return str(exc)
    return None


def measure_reruns(log=sys.stderr, only: list[str] | None = None) -> dict:
    """{key anchor: entry} for every leaf key of the schema: `reruns` (stages whose jobs rerun)
    and `then` (stages after them), in the order they run; `context` where other keys were set
    (in words); `not_measured` with the reason where the key cannot be changed here."""
    schema = load_schema()
    out = {}
    with tempfile.TemporaryDirectory(prefix="oattn-reruns-") as tmp:
        workdir = Path(tmp)
        cfg = base_config(workdir)
        planner = Planner(workdir)
        plans: dict[str, tuple] = {}
        order = None
        for key in leaf_keys(schema):
            if only and key.anchor not in only:
                continue
            if key.anchor in NOT_MEASURED:
                out[key.anchor] = {"not_measured": NOT_MEASURED[key.anchor]}
                continue
            settings, words = _context(key)
            base_cfg = _apply_context(cfg, settings, workdir)
            base_id = json.dumps(settings, sort_keys=True)
            if base_id not in plans:
                plans[base_id] = planner.plan(base_cfg)
                order = order or stage_order(plans[base_id])
            completed = _completed(base_cfg)
            variants = _variants(base_cfg, completed, key, workdir)
            problems = [_problem(v) for v in variants]
            if all(problems):
                variants = _variants(base_cfg, completed, key, workdir, fallbacks)
                problems = [_problem(v) for v in variants]
            if all(problems):
                raise RuntimeError(f"{key.anchor}: no change of it validates ({'; '.join(problems) or 'none found'}):"
                                   " add it to SPECIAL or NOT_MEASURED in docs/config_reference.py")
            stages, after = set(), set()
            for variant, problem in zip(variants, problems):
                if problem is None:
                    s, a = _diff(plans[base_id], planner.plan(variant))
                    stages |= s
                    after |= a
            order = {**stage_order(plans[base_id]), **order}
            rank = lambda s: (order.get(s, 10 ** 6), s)  # noqa: E731
            entry = {"reruns": sorted(stages, key=rank), "then": sorted(after - stages, key=rank)}
            if words:
                entry["context"] = words
            out[key.anchor] = entry
            print(f"{key.anchor}: {entry}", file=log, flush=True)
    return out


HEADER = """\
# Which stages rerun when a config key changes, measured on the workflow by
# docs/config_reference.py (its docstring says how); read by the site's configuration
# reference. Generated: do not edit. Regenerate after changing the schema or a rule's params:
#   .venv/bin/python docs/config_reference.py
"""


def dump_reruns(reruns: dict) -> str:
    return HEADER + yaml.safe_dump(reruns, sort_keys=False, width=100, default_flow_style=None)


def read_reruns(path: Path = RERUNS) -> dict:
    return yaml.load(path.read_text(), Loader=_LOADER) if path.exists() else {}  # noqa: S506 (a safe loader)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Measure which stages each config key reruns.")
    ap.add_argument("output", nargs="?", type=Path, default=RERUNS, help=f"default {RERUNS.relative_to(ROOT)}")
    ap.add_argument("--keys", nargs="+", help="measure these keys only (anchors: organize.n_iters), print them")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    reruns = measure_reruns(only=args.keys)
    if args.keys:
        print(dump_reruns(reruns))
        return 0
    args.output.write_text(dump_reruns(reruns))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
