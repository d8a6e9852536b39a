#!/usr/bin/env bash
# A/B report as a person sees it: headless Chromium renders report.html (self-contained: its plots are embedded) and
# saves a full-page screenshot. Debian: apt-get install chromium.
#
#   bash tools/report_screenshot.sh te-align-demo/ab/report.html docs/demo_report.png [width]
set -euo pipefail
report="${1:?usage: tools/report_screenshot.sh REPORT.html OUT.png [width]}"
out="${2:?usage: tools/report_screenshot.sh REPORT.html OUT.png [width]}"
width="${3:-1200}"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
  echo "tools/report_screenshot.sh: no chromium on PATH (Debian: apt-get install chromium)" >&2
  exit 2
fi
if [ ! -f "$report" ]; then
  echo "tools/report_screenshot.sh: $report: no such report (run te-align demo first)" >&2
  exit 2
fi
# the page's height: Chromium's own layout, read back through --dump-dom is not enough, so render tall and trim white
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="${width},6000" \
  --screenshot="$out.full.png" "file://$(cd "$(dirname "$report")" && pwd)/$(basename "$report")" >/dev/null 2>&1
python - "$out.full.png" "$out" <<'PY'
import sys
from PIL import Image, ImageChops
src, dst = sys.argv[1], sys.argv[2]
with Image.open(src) as im:
    im = im.convert("RGB")
    bg = Image.new("RGB", im.size, im.getpixel((im.width - 1, im.height - 1)))
    box = ImageChops.difference(im, bg).getbbox()
    (im.crop((0, 0, im.width, min(im.height, box[3] + 24))) if box else im).save(dst)
PY
rm -f "$out.full.png"
echo "$out"
