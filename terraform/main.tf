# One Silt node: a Debian 12 instance whose cloud-init installs the Silt binary (checked against
# var.silt_sha256), writes /etc/silt/silt.toml and starts silt.service; its data directory is
# a cache of the bucket, so a replaced instance recovers everything from the bucket.

data "aws_ami" "debian" {
  count = var.ami_id == null ? 1 : 0

  most_recent = true
  owners      = ["136693071363"] # Debian

  filter {
    name   = "name"
    values = ["debian-12-${var.architecture}-*"]
  }

  filter {
    name   = "architecture"
    values = [var.architecture == "arm64" ? "arm64" : "x86_64"]
  }

  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }
}

locals {
  ami_id        = var.ami_id != null ? var.ami_id : data.aws_ami.debian[0].id
  mqtt_tls      = var.mqtt_tls_cert_pem != null
  password_file = var.password_file_content != null
  # Off loopback Silt requires admin.token_file (its gRPC admin API can disconnect clients).
  admin_open  = length(var.admin_cidrs) > 0
  admin_token = local.admin_open ? random_password.admin_token[0].result : ""
  kafka_host  = var.kafka_advertised_host != null ? var.kafka_advertised_host : aws_eip.silt.public_dns

  # The arguments of silt.toml.tftpl: the node's config.
  silt_toml_vars = {
    mqtt_port        = local.ports.mqtt
    mqtt_tls         = local.mqtt_tls
    mqtt_tls_port    = local.ports.mqtt_tls
    kafka_port       = local.ports.kafka
    kafka_advertised = "${local.kafka_host}:${local.ports.kafka}"
    # Loopback unless someone may reach it; then /api/ and the gRPC admin API need the token.
    admin_host       = local.admin_open ? "0.0.0.0" : "127.0.0.1"
    admin_token_file = local.admin_open
    admin_port       = local.ports.admin
    object_store     = "s3://${aws_s3_bucket.silt.bucket}/${var.object_prefix}"
    allow_anonymous  = var.allow_anonymous
    password_file    = local.password_file
    extra_config     = var.extra_config
  }
  silt_toml = templatefile("${path.module}/silt.toml.tftpl", local.silt_toml_vars)

  # The arguments of cloud-init.yaml.tftpl: the files it writes and the binary it installs.
  cloud_init_vars = {
    silt_toml             = local.silt_toml
    silt_unit             = file("${path.module}/silt.service")
    region                = var.region
    silt_download_url     = var.silt_download_url
    silt_sha256           = var.silt_sha256
    mqtt_tls              = local.mqtt_tls
    mqtt_tls_cert_pem     = local.mqtt_tls ? var.mqtt_tls_cert_pem : ""
    mqtt_tls_key_pem      = var.mqtt_tls_key_pem != null ? var.mqtt_tls_key_pem : ""
    password_file         = local.password_file
    password_file_content = local.password_file ? var.password_file_content : ""
    admin_token_file      = local.admin_open
    admin_token           = local.admin_token
  }
  user_data = templatefile("${path.module}/cloud-init.yaml.tftpl", local.cloud_init_vars)
}

resource "random_password" "admin_token" {
  count   = length(var.admin_cidrs) > 0 ? 1 : 0
  length  = 40
  special = false
}

resource "aws_instance" "silt" {
  ami                    = local.ami_id
  instance_type          = var.instance_type
  key_name               = var.key_name
  subnet_id              = data.aws_subnet.node.id
  vpc_security_group_ids = concat([for sg in aws_security_group.listener : sg.id], [aws_security_group.node.id])
  iam_instance_profile   = aws_iam_instance_profile.silt.name

  user_data = local.user_data
  # cloud-init runs once per instance: a new config is a new instance, which recovers from the
  # bucket. The old one is destroyed first (a second node on the prefix would fence it anyway).
  user_data_replace_on_change = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    encrypted             = true
    delete_on_termination = true
  }

  tags = { Name = var.name }

  lifecycle {
    # A newer Debian image alone does not replace a running broker.
    ignore_changes = [ami]

    precondition {
      condition     = (var.mqtt_tls_cert_pem == null) == (var.mqtt_tls_key_pem == null)
      error_message = "mqtt_tls_cert_pem and mqtt_tls_key_pem go together: set both for the MQTT TLS listener, or neither."
    }
  }

  # The node writes to the bucket as soon as it starts.
  depends_on = [
    aws_iam_role_policy.silt_objects,
    aws_s3_bucket_policy.silt,
    aws_s3_bucket_server_side_encryption_configuration.silt,
  ]
}

resource "aws_eip_association" "silt" {
  instance_id   = aws_instance.silt.id
  allocation_id = aws_eip.silt.id
}
