{{- define "hookline.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hookline.labels" -}}
app.kubernetes.io/name: hookline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels: (dict "root" $ "component" "dispatcher") */}}
{{- define "hookline.selectorLabels" -}}
app.kubernetes.io/name: hookline
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "hookline.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "hookline.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "hookline.fullname" .) -}}
{{- end -}}

{{/* dispatcher autoscaler kind: keda, hpa or none */}}
{{- define "hookline.dispatcherScaler" -}}
{{- $a := .Values.dispatcher.autoscaling -}}
{{- if not $a.enabled -}}none
{{- else if eq $a.mode "keda" -}}keda
{{- else if eq $a.mode "hpa" -}}hpa
{{- else if .Capabilities.APIVersions.Has "keda.sh/v1alpha1" -}}keda
{{- else -}}hpa
{{- end -}}
{{- end -}}

{{/* hookline.toml: every binary reads it with --config. */}}
{{- define "hookline.configToml" -}}
[kafka]
bootstrap_servers = {{ .Values.kafka.bootstrapServers | quote }}
topic_prefix = {{ .Values.kafka.topicPrefix | quote }}
partitions = {{ int .Values.kafka.partitions }}
event_partitions = {{ int .Values.kafka.eventPartitions }}
replication_factor = {{ int .Values.kafka.replicationFactor }}
session_timeout_ms = {{ int .Values.kafka.sessionTimeoutMs }}
max_poll_interval_ms = {{ int .Values.kafka.maxPollIntervalMs }}
security_protocol = {{ .Values.kafka.securityProtocol | default "plaintext" | quote }}
{{- $k := .Values.kafka }}
{{- if has ($k.securityProtocol | default "plaintext") (list "ssl" "sasl_ssl") }}

[kafka.tls]
check_hostname = {{ $k.tls.checkHostname }}
{{- if $k.tls.ca.secretName }}
ca_file = "/var/run/hookline/kafka-tls/ca.crt"
{{- end }}
{{- if $k.tls.clientCert.secretName }}
cert_file = "/var/run/hookline/kafka-tls/tls.crt"
key_file = "/var/run/hookline/kafka-tls/tls.key"
{{- end }}
{{- end }}
{{- if has ($k.securityProtocol | default "plaintext") (list "sasl_plaintext" "sasl_ssl") }}

[kafka.sasl]
mechanism = {{ $k.sasl.mechanism | quote }}
{{- if eq $k.sasl.mechanism "aws_msk_iam" }}

[kafka.aws]
region = {{ $k.aws.region | quote }}
{{- else if eq $k.sasl.mechanism "oauthbearer" }}

[kafka.oauth]
token_endpoint = {{ $k.oauth.tokenEndpoint | quote }}
client_id = {{ $k.oauth.clientId | quote }}
client_secret_file = "/var/run/hookline/secrets/kafka-oauth-client-secret"
{{- with $k.oauth.scope }}
scope = {{ . | quote }}
{{- end }}
{{- else if $k.sasl.jaasConfigSecret.name }}
jaas_config_file = "/var/run/hookline/kafka-sasl/sasl.jaas.config"
{{- else }}
username = {{ $k.sasl.username | quote }}
{{- if $k.sasl.passwordSecret.name }}
password_file = "/var/run/hookline/kafka-sasl/password"
{{- else }}
password_file = "/var/run/hookline/secrets/kafka-sasl-password"
{{- end }}
{{- end }}
{{- end }}

[kafka.properties]
{{- range $k, $v := .Values.kafka.properties }}
{{ $k | quote }} = {{ $v | toString | quote }}
{{- end }}

[telemetry]
log_format = {{ .Values.telemetry.logFormat | quote }}
log_level = {{ .Values.telemetry.logLevel | quote }}

[ingest]
listen_addr = "0.0.0.0:8080"

[dispatcher]
health_addr = "0.0.0.0:9091"
max_in_flight = {{ int .Values.dispatcher.maxInFlight }}
per_subscription_concurrency = {{ int .Values.dispatcher.perSubscriptionConcurrency }}
drain_timeout_ms = {{ int .Values.dispatcher.drainTimeoutMs }}
group_id = {{ .Values.dispatcher.groupId | quote }}

[retry_scheduler]
health_addr = "0.0.0.0:9092"
max_held_per_partition = {{ int .Values.retryScheduler.maxHeldPerPartition }}
drain_timeout_ms = {{ int .Values.retryScheduler.drainTimeoutMs }}

[log]
store = {{ .Values.log.store | quote }}
retention_days = {{ int .Values.log.retentionDays }}
{{- if eq .Values.log.store "sqlite" }}
sqlite_path = "/var/lib/hookline/log/delivery-log.sqlite3"
{{- end }}

[egress]
allow_ranges = {{ .Values.egress.allowRanges | toJson }}
allow_http = {{ .Values.egress.allowHttp }}
{{- with .Values.egress.allowedPorts }}
allowed_ports = {{ toJson . }}
{{- end }}
deny_ranges = {{ .Values.egress.denyRanges | toJson }}
blocked_hostnames = {{ .Values.egress.blockedHostnames | toJson }}
{{- end -}}

{{/* Environment of every hookline container: (dict "root" $ "apiTokens" true) */}}
{{- define "hookline.env" -}}
- name: HOOKLINE_CONFIG
  value: /etc/hookline/hookline.toml
{{- if .root.Values.kafka.staticMembership }}
# Static group membership: the pod's name is its group.instance.id (unique per pod, kept across container restarts).
- name: HOOKLINE_KAFKA__GROUP_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- if .apiTokens }}
- name: HOOKLINE_INGEST__API_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ include "hookline.secretName" .root }}
      key: api-tokens
      optional: true
- name: HOOKLINE_INGEST__PORTAL__LINK_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "hookline.secretName" .root }}
      key: portal-link-secret
      optional: true
{{- end }}
- name: HOOKLINE_SECRETS__KEYS
  valueFrom:
    secretKeyRef:
      name: {{ include "hookline.secretName" .root }}
      key: master-keys
      optional: true
{{- if eq .root.Values.log.store "postgres" }}
- name: HOOKLINE_LOG__POSTGRES_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "hookline.secretName" .root }}
      key: log-postgres-url
{{- end }}
{{- end -}}

{{/* Whether the pods mount Kafka TLS files (a CA or a client certificate from existing Secrets): (dict "root" $) */}}
{{- define "hookline.kafkaTls" -}}
{{- $t := .root.Values.kafka.tls -}}
{{- if and (has (.root.Values.kafka.securityProtocol | default "plaintext") (list "ssl" "sasl_ssl")) (or $t.ca.secretName $t.clientCert.secretName) -}}true{{- end -}}
{{- end -}}

{{/* Whether the SASL password or JAAS line comes from an existing Secret of its own (a Strimzi KafkaUser's):
(dict "root" $) */}}
{{- define "hookline.kafkaSaslSecret" -}}
{{- $k := .root.Values.kafka -}}
{{- if and (has ($k.securityProtocol | default "plaintext") (list "sasl_plaintext" "sasl_ssl")) (not (has $k.sasl.mechanism (list "oauthbearer" "aws_msk_iam"))) (or $k.sasl.passwordSecret.name $k.sasl.jaasConfigSecret.name) -}}true{{- end -}}
{{- end -}}

{{/* Kafka credentials as files (volumeMounts / volumes of every hookline pod): (dict "root" $) */}}
{{- define "hookline.kafkaMounts" -}}
- name: secrets
  mountPath: /var/run/hookline/secrets
  readOnly: true
{{- if include "hookline.kafkaTls" . }}
- name: kafka-tls
  mountPath: /var/run/hookline/kafka-tls
  readOnly: true
{{- end }}
{{- if include "hookline.kafkaSaslSecret" . }}
- name: kafka-sasl
  mountPath: /var/run/hookline/kafka-sasl
  readOnly: true
{{- end }}
{{- end -}}
{{- define "hookline.kafkaVolumes" -}}
{{- $t := .root.Values.kafka.tls -}}
- name: secrets
  secret:
    secretName: {{ include "hookline.secretName" .root }}
    optional: true
    items:
      - {key: kafka-sasl-password, path: kafka-sasl-password}
      - {key: kafka-oauth-client-secret, path: kafka-oauth-client-secret}
{{- if include "hookline.kafkaTls" . }}
# The CA and the client certificate may come from different Secrets (Strimzi: the cluster CA and the KafkaUser).
- name: kafka-tls
  projected:
    sources:
      {{- with $t.ca.secretName }}
      - secret:
          name: {{ . }}
          items:
            - {key: {{ $t.ca.key | quote }}, path: ca.crt}
      {{- end }}
      {{- with $t.clientCert.secretName }}
      - secret:
          name: {{ . }}
          items:
            - {key: {{ $t.clientCert.certKey | quote }}, path: tls.crt}
            - {key: {{ $t.clientCert.keyKey | quote }}, path: tls.key}
      {{- end }}
{{- end }}
{{- if include "hookline.kafkaSaslSecret" . }}
{{- with .root.Values.kafka.sasl.jaasConfigSecret }}
{{- if .name }}
- name: kafka-sasl
  secret:
    secretName: {{ .name }}
    items:
      - {key: {{ .key | quote }}, path: sasl.jaas.config}
{{- end }}
{{- end }}
{{- if not .root.Values.kafka.sasl.jaasConfigSecret.name }}
- name: kafka-sasl
  secret:
    secretName: {{ .root.Values.kafka.sasl.passwordSecret.name }}
    items:
      - {key: {{ .root.Values.kafka.sasl.passwordSecret.key | quote }}, path: password}
{{- end }}
{{- end }}
{{- end -}}

{{/*
A Deployment: (dict "root" $ "component" "dispatcher" "binary" "hookline-dispatcher" "port" 9091
"portName" "metrics" "v" .Values.dispatcher "apiTokens" false "fixedReplicas" true)
*/}}
{{- define "hookline.deployment" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "hookline.fullname" $root }}-{{ .component }}
  labels:
    {{- include "hookline.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if .fixedReplicas }}
  replicas: {{ int .v.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  selector:
    matchLabels:
      {{- include "hookline.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "hookline.selectorLabels" (dict "root" $root "component" .component) | nindent 8 }}
      annotations:
        checksum/config: {{ include "hookline.configToml" $root | sha256sum }}
    spec:
      automountServiceAccountToken: false
      {{- with $root.Values.serviceAccountName }}
      serviceAccountName: {{ . }}
      {{- end }}
      terminationGracePeriodSeconds: {{ int .v.terminationGracePeriodSeconds }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ .component }}
          image: {{ include "hookline.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [{{ .binary | quote }}]
          env:
            {{- include "hookline.env" (dict "root" $root "apiTokens" .apiTokens) | nindent 12 }}
          ports:
            - name: {{ .portName }}
              containerPort: {{ .port }}
              protocol: TCP
          startupProbe:
            httpGet: {path: /healthz, port: {{ .portName }}}
            periodSeconds: 2
            failureThreshold: 30
          livenessProbe:
            httpGet: {path: /healthz, port: {{ .portName }}}
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          readinessProbe:
            httpGet: {path: /readyz, port: {{ .portName }}}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          resources:
            {{- toYaml .v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: config
              mountPath: /etc/hookline
              readOnly: true
            {{- include "hookline.kafkaMounts" (dict "root" $root) | nindent 12 }}
            {{- if and (eq .component "ingest") (eq $root.Values.log.store "sqlite") }}
            - name: delivery-log
              mountPath: /var/lib/hookline/log
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ include "hookline.fullname" $root }}
        {{- include "hookline.kafkaVolumes" (dict "root" $root) | nindent 8 }}
        {{- if and (eq .component "ingest") (eq $root.Values.log.store "sqlite") }}
        - name: delivery-log
          emptyDir:
            sizeLimit: {{ $root.Values.log.sqliteSizeLimit }}
        {{- end }}
      {{- with .v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* A PodDisruptionBudget: (dict "root" $ "component" "dispatcher" "pdb" .Values.dispatcher.pdb) */}}
{{- define "hookline.pdb" -}}
{{- if .pdb.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "hookline.fullname" .root }}-{{ .component }}
  labels:
    {{- include "hookline.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if hasKey .pdb "minAvailable" }}
  minAvailable: {{ .pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ .pdb.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "hookline.selectorLabels" (dict "root" .root "component" .component) | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A Service for the component's port: (dict "root" $ "component" .. "port" .. "portName" .. "type" .. "servicePort" .. "headless" bool) */}}
{{- define "hookline.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "hookline.fullname" .root }}-{{ .component }}
  labels:
    {{- include "hookline.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    hookline.dev/job: hookline-{{ .component }}
spec:
  {{- if .headless }}
  clusterIP: None
  {{- else }}
  type: {{ .type }}
  {{- end }}
  selector:
    {{- include "hookline.selectorLabels" (dict "root" .root "component" .component) | nindent 4 }}
  ports:
    - name: {{ .portName }}
      port: {{ .servicePort }}
      targetPort: {{ .portName }}
      protocol: TCP
{{- end -}}

{{/*
Every topic hookline uses, as `hookline topics create` makes it (Topics::all in crates/kafka/src/topics.rs; check-deploy
compares the two): the base name after kafka.topicPrefix, the cleanup policy, whether it has kafka.partitions
(co-partitioned) or kafka.eventPartitions, and the retention in days (0: the broker's default).
*/}}
{{- define "hookline.topicSpecs" -}}
- {base: events, cleanup: delete, coPartitioned: false, retentionDays: 30}
- {base: deliveries, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.1s, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.4s, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.15s, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.1m, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.4m, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.15m, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.1h, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: retry.4h, cleanup: delete, coPartitioned: true, retentionDays: 7}
- {base: held, cleanup: delete, coPartitioned: true, retentionDays: 30}
- {base: parked, cleanup: compact, coPartitioned: true, retentionDays: 0}
- {base: ordered, cleanup: delete, coPartitioned: true, retentionDays: 30}
- {base: dlq, cleanup: delete, coPartitioned: false, retentionDays: 30}
- {base: subscriptions, cleanup: compact, coPartitioned: true, retentionDays: 0}
- {base: endpoint-state, cleanup: compact, coPartitioned: true, retentionDays: 0, minCompactionLagDays: 1}
- {base: inflight, cleanup: compact, coPartitioned: true, retentionDays: 0}
- {base: attempts, cleanup: delete, coPartitioned: true, retentionDays: 30}
- {base: ops, cleanup: delete, coPartitioned: false, retentionDays: 30}
- {base: tenants, cleanup: compact, coPartitioned: false, retentionDays: 0}
- {base: api-keys, cleanup: compact, coPartitioned: false, retentionDays: 0}
- {base: event-types, cleanup: compact, coPartitioned: false, retentionDays: 0}
{{- end -}}

{{/* Whether the chart's topics Job runs: not when the Strimzi Topic Operator owns the topics. */}}
{{- define "hookline.topicsJob" -}}
{{- if and .Values.topicsJob.enabled (not .Values.strimzi.topics.enabled) -}}true{{- end -}}
{{- end -}}

{{/*
When the topics Job runs. Before install (and before every upgrade), unless it needs a Secret the release itself
creates: the KafkaUser's (strimzi.user.enabled), or the chart's own Secret for the SASL password or the OAuth client
secret. Then it runs after install (the services wait for their topics meanwhile) and before every upgrade.
*/}}
{{- define "hookline.topicsJobHook" -}}
{{- $k := .Values.kafka -}}
{{- $sasl := has ($k.securityProtocol | default "plaintext") (list "sasl_plaintext" "sasl_ssl") -}}
{{- $ownSecret := or $k.sasl.passwordSecret.name $k.sasl.jaasConfigSecret.name -}}
{{- $fromChartSecret := and $sasl (not .Values.secrets.existingSecret) (ne $k.sasl.mechanism "aws_msk_iam") (or (eq $k.sasl.mechanism "oauthbearer") (not $ownSecret)) -}}
{{- if or .Values.strimzi.user.enabled $fromChartSecret -}}post-install,pre-upgrade{{- else -}}pre-install,pre-upgrade{{- end -}}
{{- end -}}

{{- define "hookline.strimziUser" -}}
{{- .Values.strimzi.user.name | default (printf "%s-kafka" (include "hookline.fullname" .)) -}}
{{- end -}}
