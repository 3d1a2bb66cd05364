{{/*
vigil.toml from .Values.config. Not Helm's toToml: Helm holds every number of the values as a
float64, and toToml writes 30 as 30.0, which Vigil's integer keys refuse (its config is
strict). Here a whole number is written as an integer (Vigil's float keys take integers), any
other number as Go's shortest form, a string as JSON (a JSON string is a TOML basic string),
a null is left out (TOML has none). A table's own keys come first, then its sub-tables
([a.b]), then its arrays of tables ([[a.c]], each with its own sub-tables after it), as TOML
requires; keys in the values' (sorted) order.
*/}}
{{- define "vigil.toml" -}}
{{- include "vigil.toml.table" (dict "path" (list) "table" (.Values.config | default dict)) | trimPrefix "\n" -}}
{{- end -}}

{{- define "vigil.toml.table" -}}
{{- $path := .path -}}
{{- $out := "" -}}
{{- range $k, $v := .table -}}
{{- if not (or (kindIs "invalid" $v) (include "vigil.toml.isTable" $v) (include "vigil.toml.isTableArray" $v)) -}}
{{- $out = printf "%s%s = %s\n" $out (include "vigil.toml.key" $k) (include "vigil.toml.inline" $v) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .table -}}
{{- if include "vigil.toml.isTable" $v -}}
{{- $sub := append $path $k -}}
{{- $out = printf "%s\n[%s]\n%s" $out (include "vigil.toml.keys" $sub) (include "vigil.toml.table" (dict "path" $sub "table" $v)) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .table -}}
{{- if include "vigil.toml.isTableArray" $v -}}
{{- $sub := append $path $k -}}
{{- range $item := $v -}}
{{- $out = printf "%s\n[[%s]]\n%s" $out (include "vigil.toml.keys" $sub) (include "vigil.toml.table" (dict "path" $sub "table" $item)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out -}}
{{- end -}}

{{/* "true" for a map with keys: written as a [table] (an empty one is written inline, {}). */}}
{{- define "vigil.toml.isTable" -}}
{{- if and (kindIs "map" .) (gt (len .) 0) -}}true{{- end -}}
{{- end -}}

{{/* "true" for a list of maps, and nothing else: written as [[tables]]. */}}
{{- define "vigil.toml.isTableArray" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) -}}
{{- $maps := true -}}
{{- range . -}}
{{- if not (kindIs "map" .) -}}{{- $maps = false -}}{{- end -}}
{{- end -}}
{{- if $maps -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* A key: bare when TOML allows it, else quoted. */}}
{{- define "vigil.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ include "vigil.toml.string" . }}{{- end -}}
{{- end -}}

{{/* A dotted table name from a list of keys. */}}
{{- define "vigil.toml.keys" -}}
{{- $parts := list -}}
{{- range . -}}{{- $parts = append $parts (include "vigil.toml.key" .) -}}{{- end -}}
{{- join "." $parts -}}
{{- end -}}

{{/*
A string as a TOML basic string: JSON's escapes are TOML's (\" \\ \n \t \uXXXX ...), and
DEL, which JSON leaves raw and TOML refuses raw, is escaped too.
*/}}
{{- define "vigil.toml.string" -}}
{{- toJson (toString .) | replace "\u007f" "\\u007f" -}}
{{- end -}}

{{/* One value on the right of "key = ": scalars, arrays and inline tables. */}}
{{- define "vigil.toml.inline" -}}
{{- if kindIs "string" . -}}
{{- include "vigil.toml.string" . -}}
{{- else if kindIs "bool" . -}}
{{- ternary "true" "false" . -}}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) -}}
{{- $f := float64 . -}}
{{- if and (eq $f (floor $f)) (lt $f 9.0e18) (gt $f -9.0e18) -}}
{{- printf "%d" (int64 $f) -}}
{{- else -}}
{{- toString $f -}}
{{- end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) (kindIs "int32" .) (kindIs "uint64" .) -}}
{{- printf "%d" . -}}
{{- else if kindIs "slice" . -}}
{{- $items := list -}}
{{- range . -}}
{{- if not (kindIs "invalid" .) -}}{{- $items = append $items (include "vigil.toml.inline" .) -}}{{- end -}}
{{- end -}}
{{- printf "[%s]" (join ", " $items) -}}
{{- else if kindIs "map" . -}}
{{- $items := list -}}
{{- range $k, $v := . -}}
{{- if not (kindIs "invalid" $v) -}}{{- $items = append $items (printf "%s = %s" (include "vigil.toml.key" $k) (include "vigil.toml.inline" $v)) -}}{{- end -}}
{{- end -}}
{{- if $items -}}{{- printf "{ %s }" (join ", " $items) -}}{{- else -}}{}{{- end -}}
{{- else -}}
{{- fail (printf "vigil.toml: cannot write %v (%s) as TOML" . (kindOf .)) -}}
{{- end -}}
{{- end -}}
