"""Make the site ``asv publish`` writes work without network access.

asv's ``index.html`` loads jQuery, flot and its plugins, stupidtable, blueimp-md5 and Bootstrap from
public CDNs, so on an offline machine (or a CI box that may only talk to loopback) the page shows
asv's "failed to load" message instead of the benchmarks. This module fetches the same libraries once
from the npm registry with ``npm pack`` (``hpcnet asv-site fetch``) into a cache directory, and after
each ``asv publish`` copies them into the site and points the page at the copies
(``hpcnet asv-site localize .asv/html``).

The libraries are the versions asv pins, except stupidtable: the npm registry has no 1.0.1, so
``stupid-table-plugin`` 1.1.3 (same ``$.fn.stupidtable`` API) stands in. Where npm ships only the
unminified file (flot 0.8.3), that file is used; the CDN's subresource-integrity hashes are dropped
from the rewritten tags because the local files are not byte-identical to the CDN's.

A page that loads any other external script or stylesheet is an error (``UnknownAsset``), so an asv
upgrade that adds a library fails loudly here instead of silently in a browser.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, HpcnetError


class UnknownAsset(HpcnetError):
    """The published page loads an external file this module has no local copy for."""


@dataclass(frozen=True)
class Asset:
    url: str        # as asv's index.html names it
    package: str    # npm spec
    member: str     # file (or directory, ending in /) inside the package tarball, under package/
    local: str      # path under the site's vendor/ directory


ASSETS = (
    Asset("https://code.jquery.com/jquery-3.3.1.min.js", "jquery@3.3.1", "dist/jquery.min.js",
          "jquery/jquery.min.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js", "flot@0.8.3",
          "jquery.flot.js", "flot/jquery.flot.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js", "flot@0.8.3",
          "jquery.flot.time.js", "flot/jquery.flot.time.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js", "flot@0.8.3",
          "jquery.flot.selection.js", "flot/jquery.flot.selection.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js", "flot@0.8.3",
          "jquery.flot.categories.js", "flot/jquery.flot.categories.js"),
    Asset("https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js", "flot-orderbars@1.0.0",
          "js/jquery.flot.orderBars.js", "flot-orderbars/jquery.flot.orderBars.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js",
          "stupid-table-plugin@1.1.3", "stupidtable.min.js", "stupidtable/stupidtable.min.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js", "blueimp-md5@2.19.0",
          "js/md5.min.js", "blueimp-md5/md5.min.js"),
    Asset("https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js", "bootstrap@3.1.1",
          "dist/js/bootstrap.min.js", "bootstrap/js/bootstrap.min.js"),
    # the stylesheet loads its glyph fonts from ../fonts/, so the fonts come along
    Asset("https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css", "bootstrap@3.1.1",
          "dist/css/bootstrap.min.css", "bootstrap/css/bootstrap.min.css"),
    Asset("", "bootstrap@3.1.1", "dist/fonts/", "bootstrap/fonts/"),
)

VENDOR = "vendor"


def default_assets_dir() -> Path:
    """``$HPCNET_ASV_ASSETS``, else ``~/.cache/pytest-hpcnet/asv-assets``."""
    env = os.environ.get("HPCNET_ASV_ASSETS")
    return Path(env) if env else Path.home() / ".cache" / "pytest-hpcnet" / "asv-assets"


def missing_assets(assets_dir: Path) -> list[str]:
    """Local paths of the assets not yet in ``assets_dir`` (empty when everything is there)."""
    return [a.local for a in ASSETS if not (Path(assets_dir) / a.local).exists()]


def fetch_assets(assets_dir: Path, npm: str = "npm", timeout: float = 300) -> Path:
    """Download every asset's package with ``npm pack`` and keep the files the site needs."""
    assets_dir = Path(assets_dir)
    if shutil.which(npm) is None:
        raise ConfigError(f"{npm!r} not found; install Node.js's npm (Debian: apt-get install npm)", "npm")
    with tempfile.TemporaryDirectory(prefix="hpcnet-asv-assets-") as tmp:
        tmp = Path(tmp)
        tarballs = {}
        for spec in dict.fromkeys(a.package for a in ASSETS):
            done = subprocess.run([npm, "pack", spec, "--pack-destination", str(tmp), "--silent"],
                                  capture_output=True, text=True, timeout=timeout, cwd=tmp,
                                  stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise ConfigError(f"npm pack {spec} failed: {done.stderr.strip()[-500:]}", "npm")
            tarballs[spec] = tmp / done.stdout.strip().splitlines()[-1]
        for asset in ASSETS:
            _extract(tarballs[asset.package], asset, assets_dir)
    return assets_dir


def _extract(tarball: Path, asset: Asset, assets_dir: Path) -> None:
    prefix = "package/" + asset.member
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and
                   (m.name.startswith(prefix) if asset.member.endswith("/") else m.name == prefix)]
        if not members:
            raise ConfigError(f"{asset.member} not found in {asset.package}", str(tarball))
        for m in members:
            target = assets_dir / asset.local / m.name[len(prefix):] if asset.member.endswith("/") \
                else assets_dir / asset.local
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(target, "wb") as dst:   # no paths from the tarball used
                shutil.copyfileobj(src, dst)


_TAG = re.compile(r"<(script|link)\b[^>]*>", re.I | re.S)
_URL_ATTR = re.compile(r'\b(src|href)\s*=\s*"(https?://[^"]+)"', re.I)
_SRI_ATTRS = re.compile(r'\s+(integrity|crossorigin|referrerpolicy)\s*=\s*"[^"]*"', re.I)


def localize(html_dir: Path, assets_dir: Path | None = None) -> list[str]:
    """Copy the assets into ``<html_dir>/vendor`` and point every page's external scripts and
    stylesheets at them. Returns the URLs replaced. Idempotent (a second run finds nothing to replace)."""
    html_dir = Path(html_dir)
    assets_dir = Path(assets_dir) if assets_dir is not None else default_assets_dir()
    if not (html_dir / "index.html").is_file():
        raise ConfigError("no index.html: run `asv publish` first", str(html_dir))
    missing = missing_assets(assets_dir)
    if missing:
        raise ConfigError(f"missing {', '.join(missing)}; run `hpcnet asv-site fetch {assets_dir}` "
                          "(needs npm and access to the npm registry) once", str(assets_dir))
    by_url = {a.url: a for a in ASSETS if a.url}
    replaced: list[str] = []

    def rewrite(match: re.Match) -> str:
        tag = match.group(0)
        if match.group(1).lower() == "link" and not re.search(r'rel\s*=\s*"stylesheet"', tag, re.I):
            return tag          # rel=alternate and friends are links, not loads
        url = _URL_ATTR.search(tag)
        if not url:
            return tag
        asset = by_url.get(url.group(2))
        if asset is None:
            raise UnknownAsset(f"{url.group(2)} has no local copy; add it to ASSETS in {__name__}")
        replaced.append(asset.url)
        tag = tag.replace(url.group(0), f'{url.group(1)}="{VENDOR}/{asset.local}"')
        return _SRI_ATTRS.sub("", tag)

    pages = sorted(html_dir.glob("*.html"))
    rewritten = {page: _TAG.sub(rewrite, page.read_text(encoding="utf-8")) for page in pages}
    vendor = html_dir / VENDOR
    if vendor.exists():
        shutil.rmtree(vendor)
    for asset in ASSETS:
        src, dst = assets_dir / asset.local, vendor / asset.local
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for page, text in rewritten.items():
        page.write_text(text, encoding="utf-8")
    return replaced


# --- the command ---------------------------------------------------------------------------------

def add_commands(subparsers) -> None:
    p = subparsers.add_parser("asv-site", help="make the asv site (asv publish) work offline")
    sub = p.add_subparsers(dest="asv_site_command", required=True, metavar="ACTION")
    f = sub.add_parser("fetch", help="download the site's JavaScript/CSS libraries with npm pack (once)")
    f.add_argument("assets", nargs="?", type=Path, default=None,
                   help="cache directory (default $HPCNET_ASV_ASSETS or ~/.cache/pytest-hpcnet/asv-assets)")
    f.set_defaults(func=_fetch_command)
    loc = sub.add_parser("localize", help="after asv publish: copy the libraries in, rewrite index.html")
    loc.add_argument("html_dir", type=Path, nargs="?", default=Path(".asv/html"))
    loc.add_argument("--assets", type=Path, default=None, help="cache directory filled by `fetch`")
    loc.set_defaults(func=_localize_command)


def _fetch_command(args) -> int:
    path = args.assets or default_assets_dir()
    if missing_assets(path):
        fetch_assets(path)
    print(f"asv site assets in {path}")
    return 0


def _localize_command(args) -> int:
    replaced = localize(args.html_dir, args.assets)
    print(f"{args.html_dir}: {len(replaced)} external file(s) now load from {VENDOR}/")
    return 0
