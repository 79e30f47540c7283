# cmake -DIN=file -DOUT=header -DNAME=symbol -P embed.cmake: writes a C++ header defining
# `inline constexpr unsigned char NAME[]` with the bytes of IN (no terminating zero), so the
# binary serves the file without reading it at run time.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
get_filename_component(src "${IN}" NAME)
file(WRITE "${OUT}.tmp" "// Generated from ${src} by serve/embed.cmake; do not edit.\n#pragma once\nnamespace sluice::serve {\ninline constexpr unsigned char ${NAME}[] = {\n${bytes}\n};\n}  // namespace sluice::serve\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
