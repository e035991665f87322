output "instance_id" {
  description = "The node's EC2 instance."
  value       = aws_instance.silt.id
}

output "public_ip" {
  description = "The node's Elastic IP."
  value       = aws_eip.silt.public_ip
}

output "public_dns" {
  description = "The Elastic IP's public DNS name (inside the VPC it resolves to the private address)."
  value       = aws_eip.silt.public_dns
}

output "bucket" {
  description = "The S3 bucket holding the node's data."
  value       = aws_s3_bucket.silt.bucket
}

output "object_store" {
  description = "tiering.object_store of the node."
  value       = "s3://${aws_s3_bucket.silt.bucket}/${var.object_prefix}"
}

output "mqtt_endpoint" {
  description = "MQTT over TCP, host:port."
  value       = "${aws_eip.silt.public_dns}:${local.ports.mqtt}"
}

output "mqtt_tls_endpoint" {
  description = "MQTT over TLS, host:port; null without mqtt_tls_cert_pem."
  value       = local.mqtt_tls ? "${aws_eip.silt.public_dns}:${local.ports.mqtt_tls}" : null
}

output "kafka_bootstrap" {
  description = "Kafka bootstrap server, host:port: the advertised address."
  value       = "${local.kafka_host}:${local.ports.kafka}"
}

output "admin_token" {
  description = "The bearer token of the admin API and /api/ (silt status --token-file FILE); null while admin_cidrs is empty."
  value       = length(var.admin_cidrs) > 0 ? random_password.admin_token[0].result : null
  sensitive   = true
}

output "admin_url" {
  description = "The admin listener (/readyz, /healthz, /metrics, /iceberg); null while admin_cidrs is empty, when it binds loopback only (ssh -L 8080:127.0.0.1:8080)."
  value       = length(var.admin_cidrs) > 0 ? "http://${aws_eip.silt.public_dns}:${local.ports.admin}" : null
}
