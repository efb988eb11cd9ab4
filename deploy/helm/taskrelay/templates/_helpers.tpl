{{/* The release's base name: the release name when it already says taskrelay, else "<release>-taskrelay". */}}
{{- define "taskrelay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "taskrelay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; pass (dict "root" $ "component" "gateway"). */}}
{{- define "taskrelay.labels" -}}
helm.sh/chart: {{ include "taskrelay.chart" .root }}
{{ include "taskrelay.selectorLabels" . }}
app.kubernetes.io/part-of: taskrelay
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "taskrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "taskrelay.image" -}}
{{- printf "%s:%s" .repository (default .appVersion (toString .tag)) -}}
{{- end -}}

{{- define "taskrelay.redisName" -}}
{{- printf "%s-redis" (include "taskrelay.fullname" .) -}}
{{- end -}}

{{- define "taskrelay.authSecret" -}}
{{- default (printf "%s-auth" (include "taskrelay.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* True (non-empty) when the prefix is braced, as a Redis Cluster needs for the one-slot layout. */}}
{{- define "taskrelay.bracedPrefix" -}}
{{- if regexMatch "^\\{[^{}]+\\}" .Values.prefix }}true{{ end -}}
{{- end -}}

{{/*
Which Redis the processes use, checked once: every template that reads it includes this first, so a values set that
names none or several fails `helm template` with one line saying what to set.
*/}}
{{- define "taskrelay.redisMode" -}}
{{- $r := .Values.redis -}}
{{- $external := 0 -}}
{{- if $r.url }}{{ $external = add1 $external }}{{ end -}}
{{- if $r.urlSecret.name }}{{ $external = add1 $external }}{{ end -}}
{{- if $r.clusterNodes }}{{ $external = add1 $external }}{{ end -}}
{{- if $r.bundled.enabled -}}
{{- if gt $external 0 -}}
{{- fail "redis: set redis.bundled.enabled=false to use redis.url, redis.urlSecret or redis.clusterNodes" -}}
{{- end -}}
bundled
{{- else if ne $external 1 -}}
{{- fail "redis: with redis.bundled.enabled=false set exactly one of redis.url, redis.urlSecret.name, redis.clusterNodes" -}}
{{- else if $r.url -}}
url
{{- else if $r.urlSecret.name -}}
secret
{{- else -}}
cluster
{{- end -}}
{{- end -}}

{{/* The environment every taskrelay process reads to reach Redis (besides the shared ConfigMap). */}}
{{- define "taskrelay.redisEnv" -}}
{{- if eq (include "taskrelay.redisMode" .) "secret" }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.urlSecret.name }}
      key: {{ .Values.redis.urlSecret.key }}
{{- end }}
{{- end -}}

{{/*
A worker pool's settings: workerDefaults overlaid key by key with the pool's block (maps one level deep). Written out
by hand because sprig's merge treats false and 0 as unset, so a pool's `minReplicas: 0` or `enabled: false` would be
lost. Returns YAML; callers read it back with fromYaml.
*/}}
{{- define "taskrelay.pool" -}}
{{- $d := .defaults -}}
{{- $p := .pool -}}
{{- $out := dict -}}
{{- range $k, $v := $d -}}
{{- if hasKey $p $k -}}
{{- $pv := get $p $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $pv) -}}
{{- $m := deepCopy $v -}}
{{- range $k2, $v2 := $pv }}{{ $_ := set $m $k2 $v2 }}{{ end -}}
{{- $_ := set $out $k $m -}}
{{- else -}}
{{- $_ := set $out $k $pv -}}
{{- end -}}
{{- else -}}
{{- $_ := set $out $k (deepCopy $v) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := $p }}{{ if not (hasKey $d $k) }}{{ $_ := set $out $k $v }}{{ end }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}
