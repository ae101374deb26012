"""mkdocs hooks (mkdocs.yml `hooks:`): the pages generated at each build of the site.

- reference/config.md: every key of the config schema, with what changing it reruns
  (docs/config_reference.py; the reruns come from docs/reference/reruns.yaml, measured on the
  workflow and committed);
- measurements.md: the benchmarks' recorded outputs (docs/measurements.py);
- notebook.ipynb: examples/notebook.ipynb, which mkdocs-jupyter executes and renders.

None of them is a file under docs/: what they are made from is.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS))

import config_reference  # noqa: E402  (beside this file)
import measurements  # noqa: E402

# the pages this hook adds, which mkdocs.yml's nav lists (tests/test_site.py reads this line)
PAGES = ("reference/config.md", "measurements.md", "notebook.ipynb")
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"
# the notebook's kernel inherits this: the page shows no progress bars of model loading (nor
# tqdm's warning that a notebook lacks its widgets)
os.environ.setdefault("TQDM_DISABLE", "1")
# the generated pages: {path in the site's sources: what makes it}
GENERATED = {
    "reference/config.md": lambda: config_reference.render(config_reference.load_schema(),
                                                           config_reference.read_reruns()),
    "measurements.md": lambda: measurements.render(ROOT),
}


# before the plugins' own on_files (mkdocs-jupyter's turns the notebook added here into a page)
@event_priority(100)
def on_files(files, config):
    assert set(PAGES) == {*GENERATED, NOTEBOOK.name}, "PAGES lists the pages this hook adds"
    for src_uri, make in GENERATED.items():
        files.append(File.generated(config, src_uri, content=make()))
    # a file of its own folder, as mkdocs-jupyter reads it (it cannot read a generated file)
    files.append(File(NOTEBOOK.name, src_dir=str(NOTEBOOK.parent), dest_dir=config.site_dir,
                      use_directory_urls=config.use_directory_urls))
    return files
