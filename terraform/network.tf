# The node's subnet (given, or the first default subnet of the default VPC), its Elastic IP, and
# one security group per listener, each opened to its own list of CIDR blocks. SSH and the open
# egress share the "node" group: an interface holds 5 security groups unless the quota is raised.

data "aws_vpc" "default" {
  count   = var.subnet_id == null ? 1 : 0
  default = true
}

data "aws_subnets" "default" {
  count = var.subnet_id == null ? 1 : 0

  filter {
    name   = "vpc-id"
    values = [data.aws_vpc.default[0].id]
  }

  filter {
    name   = "default-for-az"
    values = ["true"]
  }
}

data "aws_subnet" "node" {
  id = var.subnet_id != null ? var.subnet_id : sort(data.aws_subnets.default[0].ids)[0]
}

# Allocated before the instance, so its DNS name can be written into the node's config as the
# Kafka advertised host; it also keeps the address when the instance is replaced.
resource "aws_eip" "silt" {
  domain = "vpc"
  tags   = { Name = var.name }
}

locals {
  # The ports Silt listens on (silt.toml.tftpl) and the security groups open. The health wait
  # in silt.service polls the admin port on loopback: change both together.
  ports = {
    mqtt     = 1883
    mqtt_tls = 8883
    kafka    = 9092
    admin    = 8080
    ssh      = 22
  }

  # Every listener, MQTT over TLS only with a certificate. A filter, not `cond ? { ... } : {}`:
  # Terraform refuses a conditional between objects of different attributes.
  listeners = {
    for name, l in {
      mqtt     = { port = local.ports.mqtt, cidrs = var.mqtt_cidrs, what = "MQTT" }
      mqtt_tls = { port = local.ports.mqtt_tls, cidrs = var.mqtt_tls_cidrs, what = "MQTT over TLS" }
      kafka    = { port = local.ports.kafka, cidrs = var.kafka_cidrs, what = "Kafka" }
      admin    = { port = local.ports.admin, cidrs = var.admin_cidrs, what = "admin HTTP (/metrics, /readyz, /iceberg)" }
    } : name => l if name != "mqtt_tls" || local.mqtt_tls
  }

  # One ingress rule per (listener, CIDR block).
  ingress = merge([
    for name, l in local.listeners : {
      for cidr in l.cidrs : "${name} ${cidr}" => { listener = name, port = l.port, cidr = cidr }
    }
  ]...)
}

resource "aws_security_group" "listener" {
  for_each = local.listeners

  name_prefix = "${var.name}-${replace(each.key, "_", "-")}-"
  description = "Silt ${each.value.what}: TCP ${each.value.port}"
  vpc_id      = data.aws_subnet.node.vpc_id
  tags        = { Name = "${var.name}-${each.key}" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "listener" {
  for_each = local.ingress

  security_group_id = aws_security_group.listener[each.value.listener].id
  description       = "${each.value.listener} from ${each.value.cidr}"
  ip_protocol       = "tcp"
  from_port         = each.value.port
  to_port           = each.value.port
  cidr_ipv4         = strcontains(each.value.cidr, ":") ? null : each.value.cidr
  cidr_ipv6         = strcontains(each.value.cidr, ":") ? each.value.cidr : null
}

# Out: S3, the instance metadata service, the binary's download, apt. In: SSH, when asked for.
resource "aws_security_group" "node" {
  name_prefix = "${var.name}-node-"
  description = "Silt node: SSH (TCP ${local.ports.ssh}) and all outbound traffic"
  vpc_id      = data.aws_subnet.node.vpc_id
  tags        = { Name = "${var.name}-node" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  for_each = toset(var.ssh_cidrs)

  security_group_id = aws_security_group.node.id
  description       = "ssh from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = local.ports.ssh
  to_port           = local.ports.ssh
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

resource "aws_vpc_security_group_egress_rule" "ipv4" {
  security_group_id = aws_security_group.node.id
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "ipv6" {
  security_group_id = aws_security_group.node.id
  ip_protocol       = "-1"
  cidr_ipv6         = "::/0"
}
