"""Readers for the published on-disk dataset formats; each returns ``ImageSet`` objects and raises
``DataError`` naming the file or folder it expected."""
from fedlatent.data.readers._common import read_images
from fedlatent.data.readers.cifar import (CIFAR10_CLASSES, CIFAR100_CLASSES, cifar_source, read_cifar10,
                                          read_cifar100)
from fedlatent.data.readers.ham10000 import read_ham10000
from fedlatent.data.readers.image_folders import list_image_folder, read_domains, read_image_folder
from fedlatent.data.readers.stl10 import read_stl10
from fedlatent.data.readers.tinyimagenet import read_tinyimagenet

__all__ = ["CIFAR10_CLASSES", "CIFAR100_CLASSES", "cifar_source", "list_image_folder", "read_cifar10", "read_cifar100",
           "read_domains", "read_image_folder", "read_images", "read_ham10000", "read_stl10", "read_tinyimagenet"]
