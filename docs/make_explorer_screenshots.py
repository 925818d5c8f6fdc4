"""Writes the screenshots in docs/analysis.md of the attention explorer (docs/images/explorer_*.png) from a saved model.

    python docs/make_explorer_screenshots.py                       # the main job's model, outputs/vgp
    python docs/make_explorer_screenshots.py --model DIR --out_dir DIR

Runs `hf-vlalign explore` (as `explore_model`) and opens the page in headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium), then saves three states: a word clicked (its attention over the boxes, the most
attended box solid magenta, the gold box dashed green), the worst head's cell of the grounding-probe grid clicked (the view switched to that layer and head) and
a box clicked (the words' attention on it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_browser(width: int = 1400, height: int = 1000):
    """Headless Chromium through selenium, with the system's chromedriver (no driver download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = next(
        (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
    )
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        raise RuntimeError(
            f"Chromium ({binary}) and chromedriver ({driver_path}) are needed: apt-get install chromium chromium-driver"
        )
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                     f"--window-size={width},{height}", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(argument)
    options.binary_location = binary
    return webdriver.Chrome(options=options, service=Service(driver_path))


def payload(driver) -> dict:
    return json.loads(driver.execute_script('return document.getElementById("explorer-data").textContent'))


def screenshot(driver, path: Path) -> Path:
    """The whole page: the window grows to the content's height plus the browser's own frame."""
    content = driver.execute_script("return Math.ceil(document.body.getBoundingClientRect().bottom) + 16")
    frame = driver.execute_script("return window.outerHeight - window.innerHeight")
    driver.set_window_size(1400, content + frame)
    driver.save_screenshot(str(path))
    return path


def click_region(driver, region: int) -> None:
    """A click on box `region` (dispatched to it: a box inside a larger one may be covered where selenium clicks)."""
    from selenium.webdriver.common.by import By

    rect = driver.find_element(By.CSS_SELECTOR, f'rect.region[data-region="{region}"]')
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", rect)


def take_screenshots(html: Path, out_dir: Path, prefix: str = "explorer") -> list[Path]:
    """Three states of the page at `html`, one PNG each in `out_dir`: a word of the first gold phrase clicked (on the
    probe's best head), the probe cell of the worst head clicked, and the word's most attended box clicked (best head)."""
    from selenium.webdriver.common.by import By

    out_dir.mkdir(parents=True, exist_ok=True)
    driver = start_browser()
    try:
        driver.get(html.resolve().as_uri())
        data = payload(driver)
        example = data["examples"][0]
        word = max(example["gold"][0]["tokens"]) if example["gold"] else 1
        word_span = f'#sentence span.tok[data-token="{word}"]'
        driver.find_element(By.CSS_SELECTOR, word_span).click()
        paths = [screenshot(driver, out_dir / f"{prefix}_word.png")]
        if data["probe"]:
            accuracy, (best_layer, best_head) = data["probe"]["accuracy"], data["probe"]["best"]
            cells = [(layer, head) for layer in range(len(accuracy)) for head in range(len(accuracy[layer]))]
            layer, head = min(cells, key=lambda cell: accuracy[cell[0]][cell[1]])  # the head that grounds worst
            driver.find_element(By.CSS_SELECTOR, f'td.probe-cell[data-layer="{layer}"][data-head="{head}"]').click()
            paths.append(screenshot(driver, out_dir / f"{prefix}_probe_head.png"))
            driver.find_element(
                By.CSS_SELECTOR, f'td.probe-cell[data-layer="{best_layer}"][data-head="{best_head}"]'
            ).click()
            driver.find_element(By.CSS_SELECTOR, word_span).click()
        top = int(driver.find_element(By.CSS_SELECTOR, "rect.region.top").get_attribute("data-region"))
        click_region(driver, top)
        paths.append(screenshot(driver, out_dir / f"{prefix}_region.png"))
        return paths
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> list[Path]:
    from hf_vlalign.evaluation.model_explorer import explore_model
    from hf_vlalign.synthetic import SyntheticSceneConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("outputs/vgp"), help="run from the repository root")
    parser.add_argument("--out_dir", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--html", type=Path, help="the explorer page to write (default: MODEL-explorer.html, beside the model folder)")
    parser.add_argument("--num_examples", type=int, default=4)
    parser.add_argument("--probe_examples", type=int, default=128)
    parser.add_argument("--synthetic_train_images", type=int, default=800)
    parser.add_argument("--synthetic_eval_images", type=int, default=150)
    parser.add_argument("--synthetic_seed", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not (args.model / "model.safetensors").is_file():
        raise SystemExit(
            f"{args.model} holds no model.safetensors: run `accelerate launch examples/finetune_vgp.py` first."
        )
    synthetic = SyntheticSceneConfig(args.synthetic_train_images, args.synthetic_eval_images, seed=args.synthetic_seed)
    html = explore_model(
        args.model, args.html or args.model.with_name(f"{args.model.name}-explorer.html"), num_examples=args.num_examples, synthetic=synthetic,
        probe_examples=args.probe_examples, progress=False,
    ).path  # fmt: skip
    paths = take_screenshots(html, args.out_dir)
    print(json.dumps({"html": str(html), "screenshots": [str(path) for path in paths]}, indent=2))
    return paths


if __name__ == "__main__":
    main()
