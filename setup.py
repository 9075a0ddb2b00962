"""Package layout: top-level component folders mapped into the one `evolving_infra` namespace.

`operator/` can never be imported as `operator` (the standard library's module wins at interpreter start),
so every component folder is installed as `evolving_infra.<component>`. Metadata lives in pyproject.toml.
"""

from setuptools import find_packages, setup

COMPONENTS = ("router", "node_agent", "operator", "sim", "proto")

packages = find_packages(include=["evolving_infra", "evolving_infra.*"])
package_dir = {"evolving_infra": "evolving_infra"}
for component in COMPONENTS:
    root = f"evolving_infra.{component}"
    package_dir[root] = component
    packages.append(root)
    packages.extend(f"{root}.{sub}" for sub in find_packages(where=component))

setup(packages=packages, package_dir=package_dir)
