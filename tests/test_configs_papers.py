"""The shipped paper configs (configs/feduv, spherefed, feddecorr, ...): every one loads and builds its
method; the CIFAR-100 ones carry the papers' settings key by key; the reproduce specs run exactly
these files (a spec's cell for the paper's own method equals its config); bad config references fail."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fedlatent.config import ConfigError, load_config, to_dict
from fedlatent.experiment.studies import reproduce
from fedlatent.experiment.studies.study import CONFIGS as RESOLVED
from fedlatent.experiment.studies.study import parse_study, with_configs
from fedlatent.methods import resolve

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(p for p in CONFIGS.glob("*/*.toml") if p.parent.name != "studies")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_config_loads_and_builds_its_method(path: Path) -> None:
    config = load_config(path)  # unknown keys, wrong types and keys the model/data set does not read fail here
    spec = resolve(config.algorithm, config.terms)
    assert spec.name == config.algorithm["name"]


def _load(name: str):
    config = load_config(CONFIGS / name)
    return config, to_dict(config)


# The settings issue 22 lists, per paper, for CIFAR-100 (values stated here with their source).
FEDUV_CIFAR100 = {  # FedUV (CVPR 2024) Sec. 4.1 and supplement Tables 2-3
    "data.dataset": "cifar100", "data.partition": "dirichlet", "data.num_clients": 10,
    "data.val_fraction": 0.1,            # 90/10 train/validation, original test set as test
    "data.augment": True,                # crop + flip on every data set
    "model.arch": "resnet18", "model.projector": 512,  # ResNet-18 + 512 projector
    "model.stem": "imagenet_nopool",     # "removing the initial max-pooling layer" of the ImageNet ResNet
    "train.lr": 0.01, "train.momentum": 0.9, "train.weight_decay": 1e-5,  # SGD
    "train.lr_schedule": "cosine",       # the paper states lr 0.01 and no schedule: the release's cosine over the rounds
    "train.batch_size": 128,             # not stated: the release's default
    "train.local_epochs": 10, "train.rounds": 60, "train.participation": 1.0,  # E = 10, R = 60 on CIFAR-100
    "algorithm.name": "feduv", "algorithm.mu": 0.5, "algorithm.lam": 25.0,  # μ 0.5, λ = C/4 = 100/4
}
SPHEREFED_CIFAR100 = {  # SphereFed (ECCV 2022) Sec. 5 'Implementation' and Table 16
    "data.dataset": "cifar100", "data.num_clients": 10,
    "train.momentum": 0.9, "train.weight_decay": 1e-5, "train.batch_size": 64,
    "train.local_epochs": 10, "train.rounds": 100, "train.lr_schedule": "cosine",  # cosine every round
}
# Table 16, per base (model, "+ Ours" learning rate per column IID / α 0.5 / α 0.1) and the App.'s norm
SPHEREFED_ROWS = {
    "fedavg_mobilenetv2": ("mobilenetv2", "batch", (0.5, 0.5, 1.0)),  # BatchNorm: MobileNetV2 on CIFAR-100
    "fedprox_resnet18": ("resnet18", "group", (0.5, 0.5, 0.5)),
    "fednova_vgg13": ("vgg13", "group", (0.1, 0.1, 0.1)),
    "fedopt_senet18": ("senet18", "group", (0.5, 0.5, 0.5)),  # the FedOpt + Ours row is lost in the text: 0.5 assumed
}
FEDDECORR_CIFAR100 = {  # FedDecorr (ICLR 2023) Sec. 5.1 with the release's values (run_scripts/cifar100_*.sh)
    "data.dataset": "cifar100", "data.num_clients": 10, "data.augment": True,
    "data.autoaugment": "cifar10",       # AutoAugment (Cubuk et al.) on CIFAR-100
    "model.arch": "mobilenetv2",
    "train.lr": 0.01, "train.momentum": 0.9, "train.batch_size": 64, "train.local_epochs": 10,
    "train.rounds": 100, "train.weight_decay": 1e-4,  # 1e-4 on CIFAR-100 (1e-5 on CIFAR-10)
    "algorithm.name": "feddecorr", "algorithm.beta": 0.05,  # β 0.05 on CIFAR-100 ...
    "algorithm.semantics": "official",   # ... at the release's loss scale, on which it was tuned
}


def _check(flat: dict, expected: dict, name: str) -> None:
    for key, value in expected.items():
        section, field = key.split(".")
        assert flat[section][field] == value, f"{name}: {key} = {flat[section][field]!r}, expected {value!r}"


@pytest.mark.parametrize("alpha", ["a0.01", "a1"])
def test_feduv_cifar100_configs_carry_the_papers_settings(alpha: str) -> None:
    _, flat = _load(f"feduv/cifar100_{alpha}.toml")
    _check(flat, FEDUV_CIFAR100, alpha)
    assert flat["data"]["alpha"] == {"a0.01": 0.01, "a1": 1.0}[alpha]  # Table 1: α ∈ {0.01, 1.0}


@pytest.mark.parametrize("row", sorted(SPHEREFED_ROWS))
@pytest.mark.parametrize("column", [0, 1, 2])
def test_spherefed_cifar100_configs_carry_the_papers_settings(row: str, column: int) -> None:
    label = ("cifar100_iid", "cifar100_a0.5", "cifar100_a0.1")[column]
    config, flat = _load(f"spherefed/{row}_{label}.toml")
    _check(flat, SPHEREFED_CIFAR100, f"{row}_{label}")
    arch, norm, lrs = SPHEREFED_ROWS[row]
    assert (flat["model"]["arch"], flat["model"]["norm"], flat["train"]["lr"]) == (arch, norm, lrs[column])
    assert flat["data"]["partition"] == ("iid" if column == 0 else "dirichlet")
    if column:
        assert flat["data"]["alpha"] == (0.5, 0.1)[column - 1]  # Table 2: α ∈ {0.5, 0.1}
    spec = resolve(config.algorithm, config.terms)  # + SphereFed: fixed orthonormal head, normalised z, MSE, FFC
    assert spec.head.fixed and spec.head.normalize_z and spec.loss == "mse" and spec.calibration.kind == "ffc"
    if row == "fedprox_resnet18":
        assert config.algorithm == {"name": "fedprox", "mu": 1e-4}  # Table 16: μ 1e-4 with SphereFed
    if row == "fedopt_senet18":  # Table 16: on-server SGD, learning rate 1, momentum 0.3
        assert (config.server.optimizer, config.server.lr, config.server.momentum) == ("momentum", 1.0, 0.3)


@pytest.mark.parametrize("label", ["a0.05", "a0.1", "a0.5", "iid"])
def test_feddecorr_cifar100_configs_carry_the_release_settings(label: str) -> None:
    _, flat = _load(f"feddecorr/cifar100_{label}.toml")
    _check(flat, FEDDECORR_CIFAR100, label)
    assert flat["data"]["partition"] == ("iid" if label == "iid" else "dirichlet")
    if label != "iid":
        assert flat["data"]["alpha"] == float(label[1:])


@pytest.mark.parametrize("label", ["a0.05", "a0.1", "a0.5", "iid"])
def test_feddecorr_tinyimagenet_configs_carry_the_release_settings(label: str) -> None:
    """The release (run_scripts/tinyim_*.sh, dataset_utils.py): 50 rounds, weight decay 1e-4, β 0.1,
    AutoAugment without crop or flip on TinyImageNet."""
    _, flat = _load(f"feddecorr/tinyimagenet_{label}.toml")
    _check(flat, {"data.dataset": "tinyimagenet", "data.augment": False, "data.autoaugment": "cifar10",
                  "train.rounds": 50, "train.weight_decay": 1e-4, "algorithm.beta": 0.1}, label)


def test_spherefed_tinyimagenet_uses_groupnorm_and_ccvr_doubles_its_virtual_features() -> None:
    """App.: GroupNorm in every experiment but MobileNetV2 on CIFAR-100; Table 16: CCVR 1000 per class."""
    config, _ = _load("spherefed/fedavg_mobilenetv2_tinyimagenet.toml")
    assert config.model.options["norm"] == "group"
    cells = {c.labels["method"]: c.config for c in reproduce.load_spec("spherefed_table2").cells
             if c.labels["setting"] == "tiny"}
    for method in ("fedavg+ccvr", "fedprox+ccvr", "fednova+ccvr", "fedopt+ccvr"):
        calibration = resolve(cells[method].algorithm, cells[method].terms).calibration
        assert (calibration.kind, calibration.virtual_per_class, calibration.lr) == ("ccvr", 1000, 1e-5)


@pytest.mark.parametrize("tier, setting", [("full", "cifar100-a0.1"), ("cpu", "cifar10-a0.1"),
                                           ("quick", "digits-a0.1")])
def test_spherefed_table2_alpha_0_1_cells_take_table_16s_rate_in_every_tier(tier: str, setting: str) -> None:
    """Table 16: FedAvg + Ours at lr 0.5, 0.5, 1.0, 0.5 (IID, α = 0.5, α = 0.1, TinyImageNet); a
    reduced tier's cell that stands for the α = 0.1 column takes 1.0 too."""
    rates = {(c.labels["setting"], c.labels["method"]): c.config.train.lr
             for c in reproduce.load_spec("spherefed_table2", tier=tier).cells}
    assert rates[setting, "fedavg+ours"] == 1.0
    assert rates[setting, "fedavg"] == 0.1
    assert {lr for (s, m), lr in rates.items() if m == "fedavg+ours" and s != setting} <= {0.5}


# each config ↔ (spec, the cell's labels running the paper's own method on it)
def _pairs() -> list[tuple[str, str, dict[str, str]]]:
    pairs = []
    for setting, stem in [("stl10-a0.01", "stl10_a0.01"), ("stl10-a1", "stl10_a1"), ("cifar100-a0.01", "cifar100_a0.01"),
                          ("cifar100-a1", "cifar100_a1"), ("tiny-a0.01", "tinyimagenet_a0.01"),
                          ("tiny-a1", "tinyimagenet_a1"), ("pacs", "pacs"), ("ham10000", "ham10000"),
                          ("officehome", "officehome")]:
        pairs.append((f"feduv/{stem}.toml", "feduv_table1", {"setting": setting, "method": "feduv"}))
    for ds, short, spec in [("cifar10", "cifar10", "feddecorr_table1"), ("cifar100", "cifar100", "feddecorr_table1"),
                            ("tinyimagenet", "tiny", "feddecorr_table2")]:
        for het in ("a0.05", "a0.1", "a0.5", "iid"):
            pairs.append((f"feddecorr/{ds}_{het}.toml", spec, {"setting": f"{short}-{het}", "method": "fedavg+decorr"}))
    for row in SPHEREFED_ROWS:
        base = row.split("_")[0]
        for stem, setting in [("cifar100_iid", "cifar100-iid"), ("cifar100_a0.5", "cifar100-a0.5"),
                              ("cifar100_a0.1", "cifar100-a0.1"), ("tinyimagenet", "tiny")]:
            pairs.append((f"spherefed/{row}_{stem}.toml", "spherefed_table2", {"setting": setting, "method": f"{base}+ours"}))
    # the appendix and ablation specs whose own-method row is a shipped config as it is
    for stem, setting in [("cifar100_iid", "cifar100-iid"), ("cifar100_a0.1", "cifar100-a0.1")]:
        pairs.append((f"spherefed/fedopt_senet18_{stem}.toml", "spherefed_table4", {"setting": setting, "calibration": "ffc"}))
    pairs.append(("spherefed/fedavg_mobilenetv2_cifar100_a0.5.toml", "spherefed_table10", {"setting": "cifar100-a0.5", "init": "qr"}))
    for setting in ("synthetic00", "synthetic05"):
        pairs.append((f"ditto/paper_{setting}_ditto_mkmmd_every20.toml", "ditto_figure3", {"setting": setting, "kernels": "mkmmd"}))
    return pairs


@pytest.mark.parametrize("spec", ["feduv_table1", "feddecorr_table1", "feddecorr_table2", "spherefed_table2",
                                  "spherefed_table4", "spherefed_table10", "ditto_figure3"])
def test_spec_cells_of_the_papers_methods_equal_the_shipped_configs(spec: str) -> None:
    """The table's own-method rows run the configs users run (nothing restated differently in the spec)."""
    cells = reproduce.load_spec(spec).cells
    pairs = [p for p in _pairs() if p[1] == spec]
    assert pairs
    for name, _, labels in pairs:
        seed = str(load_config(CONFIGS / name).seed)  # the file's own seed (0; the Ditto configs 2021)
        cell = next(c for c in cells if c.labels["seed"] == seed and all(c.labels[k] == v for k, v in labels.items()))
        assert to_dict(cell.config) == to_dict(load_config(CONFIGS / name)), f"{spec} {labels} differs from {name}"


def test_every_paper_config_is_run_by_a_spec() -> None:
    shipped = {f"{p.parent.name}/{p.name}" for p in SHIPPED if p.parent.name in ("feduv", "feddecorr", "spherefed")}
    assert shipped == {name for name, _, _ in _pairs() if not name.startswith("ditto/")}


def _cells(spec: str, axis: str) -> dict:
    """A single-seed spec's cells by their label on ``axis``."""
    return {c.labels[axis]: c for c in reproduce.load_spec(spec).cells}


def test_cost_spec_is_table_2s_column_with_flops_and_its_rows_own_settings() -> None:
    """Table 1: the SphereFed row is the α = 0.5 config plus the FLOPs diagnostic; FedAvg and CCVR at lr 0.1."""
    cells = _cells("spherefed_table1", "method")
    ours = to_dict(cells["ours"].config)
    assert ours.pop("diagnostics")["which"] == ["flops"]
    expected = to_dict(load_config(CONFIGS / "spherefed/fedavg_mobilenetv2_cifar100_a0.5.toml"))
    expected.pop("diagnostics")
    assert ours == expected
    ccvr = resolve(cells["ccvr"].config.algorithm, cells["ccvr"].config.terms).calibration
    assert (ccvr.kind, ccvr.virtual_per_class, ccvr.lr, cells["ccvr"].config.train.lr) == ("ccvr", 500, 1e-5, 0.1)


def test_appendix_specs_set_the_papers_switches() -> None:
    """Table 4: calibration none / CCVR / FFC / centralised on FedOpt + SphereFed; Table 8: merged test
    sets with 15 % local test splits, head-only SGD and personal FFC; Table 9: FFC on a random fixed
    CE head; Table 10: Tammes with 10⁴ steps; Table 3's temperatures; Figure 3's fixed kernels."""
    kinds = {k: resolve(c.config.algorithm, c.config.terms) for k, c in _cells("spherefed_table4", "calibration").items()}
    assert {k: s.calibration.kind for k, s in kinds.items()} == {"none": "none", "ccvr": "ccvr", "ffc": "ffc",
                                                                  "sanity": "centralized", "sanity_mse": "centralized"}
    assert (kinds["sanity"].calibration.loss, kinds["sanity_mse"].calibration.loss) == ("ce", "mse")  # the paper tries both
    assert all(s.head.fixed and s.loss == "mse" for s in kinds.values())
    table8 = reproduce.load_spec("spherefed_table8")
    assert all(c.config.data.merge_test and c.config.data.local_test_fraction == 0.15 for c in table8.cells)
    specs = {c.labels["method"]: resolve(c.config.algorithm, c.config.terms) for c in table8.cells
             if c.labels["setting"] == "cifar100-a0.1"}
    assert specs["ours_sgd"].personalization.scope == "head" and specs["ours_sgd"].calibration.kind == "none"
    assert specs["ours_ffc"].calibration.personal and specs["fedbabu"].personalization.scope == "all"
    table9 = {k: resolve(c.config.algorithm, c.config.terms) for k, c in _cells("spherefed_table9", "method").items()}
    assert table9["fix_r+ffc"].loss == "ce" and table9["fix_r+ffc"].calibration.kind == "ffc"
    assert table9["fix_r"].head.fixed and table9["fix_r"].head.init == "default" and not table9["fix_r"].head.normalize_z
    tammes = resolve(_cells("spherefed_table10", "init")["tammes"].config.algorithm)
    assert (tammes.head.init, tammes.head.init_steps) == ("tammes", 10_000)
    temps = {c.config.algorithm["temperature"] for c in reproduce.load_spec("spherefed_table3_tau").cells}
    assert temps == {1.0, 0.5, 0.2, 0.1, 0.05}
    fixed = {c.labels["kernels"]: c.config.algorithm.get("fixed_kernels", 0) for c in reproduce.load_spec("ditto_figure3").cells}
    assert fixed == {"fixed1": 1, "fixed5": 5, "fixed10": 10, "fixed18": 18, "mkmmd": 0, "mmdd": 0}


SPHEREFED_SPECS = ["spherefed_table1", "spherefed_table2", "spherefed_table3", "spherefed_table3_tau", "spherefed_table4",
                   "spherefed_table5", "spherefed_table6", "spherefed_table7", "spherefed_table8", "spherefed_table9",
                   "spherefed_table10"]


@pytest.mark.parametrize("spec", SPHEREFED_SPECS)
def test_spherefed_mobilenetv2_cells_have_the_projection_relu(spec: str) -> None:
    """App. Table 14: SphereFed's MobileNetV2 has a ReLU after each block's projection."""
    cells = [c for c in reproduce.load_spec(spec).cells if c.config.model.arch == "mobilenetv2"]
    assert all(c.config.model.options.get("projection_relu") is True for c in cells), spec


FEDUV_SPECS = ["feduv_table1", "feduv_table2", "feduv_table3", "feduv_table4", "feduv_table6", "feduv_supp_table2",
               "feduv_supp_table4", "feduv_supp_table5"]


FEDUV_MAIN_TEXT = ["feduv_table1", "feduv_table2", "feduv_table3"]  # the tables with a FedProx row


@pytest.mark.parametrize("spec", FEDUV_SPECS)
def test_feduv_cells_carry_the_papers_network_schedule_and_fedprox(spec: str) -> None:
    """Sec. 4.1: ResNets without the max-pool of the ImageNet stem, lr 0.01; the release's batch 128 and
    cosine over the rounds (neither stated); FedProx μ 0.01 in the main text's tables (feduv.txt:130),
    the supplement's μ sweep (Tables 2-3) one row per μ, 0.001 the underlined one."""
    fedprox = set()
    for cell in reproduce.load_spec(spec).cells:
        config = cell.config
        if config.model.arch in ("resnet18", "resnet50"):
            assert config.model.options["stem"] == "imagenet_nopool", cell.name
        assert (config.train.batch_size, config.train.lr_schedule, config.train.lr, config.train.lr_min) == \
            (128, "cosine", 0.01, 0.0), cell.name
        if config.algorithm["name"] == "fedprox":
            fedprox.add((cell.labels["method"], config.algorithm["mu"]))
    if spec in FEDUV_MAIN_TEXT:
        assert fedprox == {("fedprox", 0.01)}
    elif spec == "feduv_supp_table2":
        assert fedprox == {(f"fedprox-mu{mu:g}", mu) for mu in (0.001, 0.01, 0.1, 1.0)}
    else:
        assert not fedprox


def test_feduv_supplement_tiers_run_its_underlined_fedprox_and_table_1s_cpu_tier_the_main_texts() -> None:
    for tier in ("quick", "cpu"):
        supp = {c.config.algorithm["mu"] for c in reproduce.load_spec("feduv_supp_table2", tier=tier).cells
                if c.config.algorithm["name"] == "fedprox"}
        assert supp == {0.001}, tier
    main = {c.config.algorithm["mu"] for c in reproduce.load_spec("feduv_table1", tier="cpu").cells
            if c.config.algorithm["name"] == "fedprox"}
    assert main == {0.01}


def test_feduv_configs_anneal_the_rate_by_the_releases_cosine_and_keep_constant_one_key_away() -> None:
    for path in sorted((CONFIGS / "feduv").glob("*.toml")):
        assert load_config(path).train.lr_schedule == "cosine", path.name
        assert load_config(path, ['train.lr_schedule="constant"']).train.lr_schedule == "constant"


def test_feddecorr_moon_rows_use_the_releases_projection_head() -> None:
    """FedDecorr Table 1's MOON rows: the release's --use_proj_head, Linear(1280, 640)-ReLU-Linear(640, 256)."""
    moon = [c for c in reproduce.load_spec("feddecorr_table1").cells if c.config.algorithm["name"] == "moon"]
    assert moon and all((c.config.model.projector, c.config.model.options["projector_form"]) == (256, "feddecorr_moon")
                        for c in moon)


def test_tinyimagenet_spherefed_configs_stride_their_first_block() -> None:
    """App. Tables 13-15: TIN_S = 2 for MobileNetV2, ResNet-18, SENet-18 (VGG-13: its pool, built in);
    spherefed_table2's TinyImageNet rows that replace [model] keep it."""
    for row in ("fedavg_mobilenetv2", "fedprox_resnet18", "fedopt_senet18"):
        assert load_config(CONFIGS / f"spherefed/{row}_tinyimagenet.toml").model.options["first_stride"] == 2
    for cell in reproduce.load_spec("spherefed_table2").cells:
        expected = 2 if cell.labels["setting"] == "tiny" and cell.config.model.arch != "vgg13" else 1
        assert cell.config.model.options.get("first_stride", 1) == expected, cell.name


def _spec(tmp_path: Path, label: dict, quick_replaces: bool) -> tuple[dict, Path]:
    raw = {"title": "t", "variants": {"setting": {"s": label}, "method": {"m": {"algorithm": {"name": "fedavg"}}}},
           "published": [{"where": {"setting": "s"}, "value": 1.0}],
           "quick": {"base": {"data": {"dataset": "digits"}},
                     **({"variants": {"setting": {"q": {}}}} if quick_replaces else {})}}
    return raw, tmp_path


def test_a_config_label_sets_the_files_sections_then_its_own_keys(tmp_path: Path) -> None:
    raw, folder = _spec(tmp_path, {"config": "feduv/stl10_a1.toml", "train.rounds": 7}, True)
    study = parse_study(with_configs(raw), folder)
    config = study.cells[0].config
    assert config.train.rounds == 7 and config.data.dataset == "stl10" and config.data.alpha == 1.0
    assert config.algorithm == {"name": "fedavg"}  # a later axis replaced the file's [algorithm]
    assert raw["variants"]["setting"]["s"] == {"config": "feduv/stl10_a1.toml", "train.rounds": 7}  # not mutated


def test_an_unknown_config_is_one_line_naming_the_label_unless_quick_replaces_its_axis(tmp_path: Path) -> None:
    raw, _ = _spec(tmp_path, {"config": "feduv/nope.toml"}, True)
    with pytest.raises(ConfigError, match=r"variants\.setting\.s: config 'feduv/nope\.toml' not found"):
        with_configs(raw)
    assert with_configs(raw, tier="quick")["variants"]["setting"]["s"] == {"config": "feduv/nope.toml"}
    kept, _ = _spec(tmp_path, {"config": "feduv/nope.toml"}, False)
    with pytest.raises(ConfigError, match="not found"):  # the quick version keeps this axis: its configs are read
        with_configs(kept, tier="quick")
    wrong, _ = _spec(tmp_path, {"config": 3}, False)
    with pytest.raises(ConfigError, match=r"config = 3: expected a path under configs/"):
        with_configs(wrong)


def test_the_resolver_finds_the_shipped_configs_from_another_working_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert (RESOLVED / "feduv" / "stl10_a1.toml").samefile(CONFIGS / "feduv" / "stl10_a1.toml")
    raw, _ = _spec(tmp_path, {"config": "feduv/stl10_a1.toml"}, False)
    assert with_configs(raw)["variants"]["setting"]["s"]["data"]["dataset"] == "stl10"


@pytest.mark.slow
def test_an_installed_wheel_carries_the_configs_and_resolves_them(tmp_path: Path) -> None:
    """A non-editable install (wheel unpacked into a folder that is not the checkout) holds every shipped
    config, spec and settings table as package data, and a spec's config labels resolve there from
    another working directory."""
    root = tmp_path / "checkout"  # a copy, so that the build leaves nothing in the working tree
    for part in ("src", "configs"):
        shutil.copytree(CONFIGS.parent / part, root / part, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(CONFIGS.parent / part, root / part)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(root)], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("fedlatent-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"fedlatent/configs/{p.relative_to(CONFIGS).as_posix()}" for p in CONFIGS.rglob("*.toml")}
    assert shipped and shipped <= names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    (tmp_path / "work").mkdir()
    probe = ("from fedlatent.experiment.studies import reproduce, settings, study; "
             "print(study.CONFIGS.resolve()); print(reproduce.load_spec('feduv_table1').cells[0].config.data.dataset); "
             "print(len(reproduce.spec_names()), ','.join(settings.names()))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                         cwd=tmp_path / "work", env={"PYTHONPATH": str(tmp_path / "site"), "PATH": ""}).stdout.split()
    tables = ",".join(p.stem for p in sorted((RESOLVED.parent / "experiment" / "studies" / "settings").glob("*.toml")))
    assert out == [str((tmp_path / "site" / "fedlatent" / "configs").resolve()), "stl10",
                   str(len(reproduce.spec_names())), tables]  # the specs and settings tables shipped too
