# FindHttpParser.cmake — locate the http-parser C library (nodejs/http-parser, Debian's
# libhttp-parser-dev), which ships no CMake config. elastic's etcd client parses HTTP with it.
#
# Result: the imported target HttpParser::HttpParser, and HttpParser_FOUND /
# HttpParser_INCLUDE_DIR / HttpParser_LIBRARY / HttpParser_VERSION.
include(FindPackageHandleStandardArgs)

find_path(HttpParser_INCLUDE_DIR NAMES http_parser.h)
find_library(HttpParser_LIBRARY NAMES http_parser)

if(HttpParser_INCLUDE_DIR AND EXISTS "${HttpParser_INCLUDE_DIR}/http_parser.h")
  file(STRINGS "${HttpParser_INCLUDE_DIR}/http_parser.h" _hp_lines REGEX "^#define HTTP_PARSER_VERSION_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*HTTP_PARSER_VERSION_${_part} ([0-9]+).*" "\\1" _hp_${_part} "${_hp_lines}")
  endforeach()
  set(HttpParser_VERSION "${_hp_MAJOR}.${_hp_MINOR}.${_hp_PATCH}")
endif()

find_package_handle_standard_args(HttpParser
  REQUIRED_VARS HttpParser_LIBRARY HttpParser_INCLUDE_DIR
  VERSION_VAR HttpParser_VERSION)

if(HttpParser_FOUND AND NOT TARGET HttpParser::HttpParser)
  add_library(HttpParser::HttpParser UNKNOWN IMPORTED)
  set_target_properties(HttpParser::HttpParser PROPERTIES
    IMPORTED_LOCATION "${HttpParser_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${HttpParser_INCLUDE_DIR}")
endif()
mark_as_advanced(HttpParser_INCLUDE_DIR HttpParser_LIBRARY)
