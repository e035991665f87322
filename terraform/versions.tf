terraform {
  # strcontains() needs 1.5.
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0, < 7.0"
    }
    # The admin API's bearer token when admin_cidrs opens the listener.
    random = {
      source  = "hashicorp/random"
      version = ">= 3.5, < 4.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge({ "silt:deployment" = var.name }, var.tags)
  }
}
