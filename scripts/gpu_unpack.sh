#!/usr/bin/env bash
# Unpacks the xz-compressed binaries in .gpu/ (python's lzma, in case xz is missing there).
for f in .gpu/*.xz; do
  b=${f%.xz}
  [ -x "$b" ] || python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$f" "$b"
  chmod +x "$b"
done
