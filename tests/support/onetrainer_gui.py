"""Drive OneTrainer's Qt GUI headless through a (patched) checkout: start training from a config, wait, quit.

    python -m tests.support.onetrainer_gui CHECKOUT CONFIG.json      (QT_QPA_PLATFORM=offscreen)

Runs ``CHECKOUT/scripts/train_ui_qt.py`` as a module (so a te-align drop-in there installs the hooks the way a
user's GUI start does), writes the config as the GUI's last session (``training_presets/#.json``, which the
GUI loads at start-up), builds the application and the training window as its ``main()`` does, presses
"start training" and polls until the training thread is gone. Dialogs are answered yes and printed. Prints
``gui: training finished`` at the end; exit 1 if training never started.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any


def main(checkout: str, config: str) -> int:
    # the GUI restores its last session from training_presets/#.json at start-up (OneTrainer's
    # modules/ui/BaseTopBarView.py): the config goes there, and the GUI's own loading fills the window
    presets = Path(checkout) / "training_presets"
    presets.mkdir(exist_ok=True)
    text = Path(config).read_text(encoding="utf-8")
    (presets / "#.json").write_text(text, encoding="utf-8")
    # ... and reads the concepts and sample prompts from their own files (concept_file_name and
    # sample_definition_file_name, default training_concepts/concepts.json, training_samples/samples.json)
    cfg = json.loads(text)
    for key, default, field in (("concept_file_name", "training_concepts/concepts.json", "concepts"),
                                ("sample_definition_file_name", "training_samples/samples.json", "samples")):
        target = Path(checkout) / cfg.get(key, default)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(cfg.get(field) or []), encoding="utf-8")
    ns = runpy.run_path(str(Path(checkout) / "scripts" / "train_ui_qt.py"), run_name="te_align_gui_driver")
    from PySide6.QtCore import QTimer

    app = ns["create_application"]()
    window = ns["PySide6TrainView"]()
    controller = window.controller

    def say(kind: str) -> Any:
        return lambda *args, **kwargs: print(f"gui {kind}: {args}", flush=True) or True

    window.show_validation_errors = say("validation errors")
    window.confirm = say("confirm")
    for name in ("show_error", "show_warning", "show_info"):
        if hasattr(window, name):
            setattr(window, name, say(name))
    state = {"started": False}

    def tick() -> None:
        if not state["started"]:
            state["started"] = True
            controller.start_training()
            state["thread"] = controller.training_thread is not None
            print(f"gui: training started: {state['thread']}", flush=True)
            if not state["thread"]:
                app.quit()
        elif controller.training_thread is None:
            print("gui: training finished", flush=True)
            app.quit()

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(200)
    app.exec()
    return 0 if state.get("thread") else 1


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
